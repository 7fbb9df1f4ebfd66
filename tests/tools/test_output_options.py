"""Every command's ``--out`` file is checked with its options, before its work: a folder, or a
path under a file, is one line and exit 2 (after the work, the output would be lost)."""

import pytest

from analysis import reproducibility
from benchmarks import tune
from benchmarks.miniature import pretrain
from benchmarks.tools import loader_speed, pipeline_speed, shared_cores, speed, train_speed

COMMANDS = {
    "benchmarks.tools.speed": speed.main,
    "benchmarks.tools.loader_speed": loader_speed.main,
    "benchmarks.tools.pipeline_speed": pipeline_speed.main,
    "benchmarks.tools.train_speed": train_speed.main,
    "benchmarks.tools.shared_cores": shared_cores.main,
    "benchmarks.miniature.pretrain": pretrain.main,
    "analysis.reproducibility": reproducibility.main,
}


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_an_out_that_cannot_be_written_is_one_line_before_any_work(capsys, tmp_path, name, where):
    (tmp_path / "file").write_text("")
    out = tmp_path if where == "a folder" else tmp_path / "file" / "out.json"
    with pytest.raises(SystemExit) as stop:
        COMMANDS[name](["--out", str(out)])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    said = (
        "is a folder; give a file path" if where == "a folder" else "which is a file; give a path in a folder"
    )
    assert line.startswith(f"error: --out {out}") and said in line and line.endswith(" --help")


def test_the_tune_commands_out_is_checked_with_its_options(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        tune.parse_args(
            [
                "--suite",
                "smoke",
                "--strategies",
                "gr4cil",
                "--space",
                "x",
                "--trials",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: --out {tmp_path} is a folder")
