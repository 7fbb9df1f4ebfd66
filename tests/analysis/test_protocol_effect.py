"""The protocol table (as-published minus one-protocol) and compare's refusal across protocols, on
small runs of the offline world made under each protocol."""

import json

import pytest

from analysis import compare, protocol_effect
from benchmarks import run
from benchmarks.core.errors import UserError
from benchmarks.runner.reading import iter_results
from benchmarks.runner.result_record import result_digest

SUITE = """
datasets = ["synthetic"]
tasks = [2]
seeds = [0, 1]
strategies = ["continual_clip", "finetune"]
device = "cpu"
protocol = "{protocol}"
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[dataset.synthetic]
n_train_per_class = 4
n_test_per_class = 2
[defaults]
batch_size = 32
eval_batch_size = 200
lora_rank = 2
[strategy.finetune]
epochs = 1
"""


@pytest.fixture(scope="module")
def two_protocols(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocols")
    folders = {}
    for protocol in ("one-protocol", "as-published"):
        suite = root / f"{protocol}.toml"
        suite.write_text(SUITE.replace("{protocol}", protocol))
        folders[protocol] = root / protocol
        assert run.main(["--suite", str(suite), "--results-dir", str(folders[protocol]), "--quiet"]) == 0
    return folders


def _shift(folder, label: str, by_seed: dict[int, float]) -> None:
    """Add ``by_seed[seed]`` points to every stage accuracy of ``label``'s stored results, as a run
    under another protocol would have computed them (so with the digest of its new stages)."""
    for path, result in iter_results(folder):
        if result["label"] == label:
            for stage in result["stages"]:
                stage["acc"] += by_seed[result["seed"]]
            result["summary"]["last_acc"] += by_seed[result["seed"]]
            result["summary"]["avg_acc"] += by_seed[result["seed"]]
            result["digest"] = result_digest(result["stages"], result["summary"])
            path.write_text(json.dumps(result))


def test_the_same_protocol_content_moves_no_row_and_a_known_shift_is_recovered(two_protocols, tmp_path):
    # on the synthetic world no source sets anything: both protocols compute the same numbers
    frame, notes = protocol_effect.protocol_effect(
        two_protocols["one-protocol"], two_protocols["as-published"]
    )
    assert set(frame["strategy"]) == {"continual_clip", "finetune"} and set(frame["n"]) == {2}
    assert set(frame["Δ Last [95 % CI]"]) == {"+0.00 [+0.00, +0.00]"}
    # the one note: these runs, on the synthetic world, rank nothing
    assert [note.split(":")[0] for note in notes] == [
        "8 run(s) are on the synthetic world with the tiny CLIP"
    ]

    _shift(two_protocols["as-published"], "finetune", {0: 2.0, 1: 4.0})
    frame, _ = protocol_effect.protocol_effect(two_protocols["one-protocol"], two_protocols["as-published"])
    row = frame.set_index("strategy").loc["finetune"]
    estimate, low, high = (
        float(x) for x in row["Δ Last [95 % CI]"].replace("[", "").replace("]", "").replace(",", "").split()
    )
    assert estimate == pytest.approx(3.0) and 2.0 <= low <= high <= 4.0  # a bootstrap over the 2 seeds
    assert row["Δ Avg [95 % CI]"].startswith("+3.00")
    paths = protocol_effect.write_protocol_effect(frame, tmp_path)
    assert "How much the protocol moves each row" in paths[0].read_text()


def test_each_folder_must_hold_its_protocol(two_protocols):
    with pytest.raises(UserError, match="holds a 'as-published' run"):
        protocol_effect.protocol_effect(two_protocols["as-published"], two_protocols["one-protocol"])


def test_compare_refuses_to_pair_across_protocols_unless_asked(two_protocols, tmp_path, capsys):
    folders = [
        str(two_protocols["one-protocol"] / "synthetic" / "finetune"),
        str(two_protocols["as-published"] / "synthetic" / "continual_clip"),
    ]
    argv = [
        "--results-dir",
        *folders,
        "--baseline",
        "continual_clip",
        "--out",
        str(tmp_path),
        "--draws",
        "200",
    ]
    assert compare.main(argv) == 2
    assert "differ in evaluation protocol" in capsys.readouterr().err
    assert compare.main([*argv, "--across-protocols"]) == 0
    assert "across protocols: seeds resampled" in (tmp_path / "compare-last.md").read_text()


def test_the_report_adds_the_protocol_table(two_protocols, tmp_path):
    from analysis.report import build_report

    items = build_report(
        two_protocols["one-protocol"], tmp_path, as_published_dir=two_protocols["as-published"]
    )
    (item,) = [i for i in items if i.name == "protocol_effect"]
    assert item.written and "protocol moves each row" in (tmp_path / "report.md").read_text()
