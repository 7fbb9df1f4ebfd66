"""A suite's rows on other weights: ``[variants.LABEL] backbone = {model, pretrained}`` over the
suite's ``[backbone]``, each such row a label of its own; the ``backbones`` suite built from it."""

import hashlib

import pytest

from benchmarks.core.errors import UserError
from benchmarks.runner.building import resolve
from benchmarks.runner.suites import available_suites, expand, load_suite

OPENAI = {"model": "ViT-B-16-quickgelu", "pretrained": "openai"}
LAION = {"model": "ViT-B-16", "pretrained": "laion400m_e32"}


def test_the_backbones_suite_pairs_openai_and_laion_rows_of_three_strategies():
    suite = load_suite("backbones")
    runs = expand(suite, device="cpu")
    assert (
        len(runs) == 2 * 6 * 3 and {r.n_tasks for r in runs} == {10} and {r.seed for r in runs} == {0, 1, 2}
    )
    assert {r.dataset for r in runs} == {"cifar100", "imagenet_r"}
    by_label = {r.label: r for r in runs}
    for strategy in ("gr4cil", "mg_clip", "coda_prompt"):
        openai, laion = by_label[strategy], by_label[f"{strategy}-laion400m"]
        assert (openai.strategy, laion.strategy) == (strategy, strategy)
        assert (openai.backbone, laion.backbone) == (OPENAI, LAION)
        assert (
            laion.config["backbone"] == LAION
            and resolve(openai, ".").config_hash != resolve(laion, ".").config_hash
        )
        # the same recipe on either weights: only the backbone tells the rows apart
        assert laion.strategy_options == openai.strategy_options
        assert "backbone" not in laion.option_sources
    # the OpenAI rows are main's runs, hash for hash
    main = {(r.label, r.dataset, r.seed): r for r in expand(load_suite("main"), device="cpu")}
    for run in (r for r in runs if r.backbone == OPENAI):
        assert (
            resolve(main[(run.label, run.dataset, run.seed)], ".").config_hash
            == resolve(run, ".").config_hash
        )


def test_every_suite_but_backbones_keeps_one_backbone_for_every_run():
    for name in available_suites():
        runs = expand(load_suite(name), device="cpu")
        backbones = {tuple(sorted(r.backbone.items(), key=str)) for r in runs}
        assert len(backbones) == 1 or name == "backbones", name


def test_weights_from_the_command_line_replace_every_rows_tag_but_not_its_model(tmp_path):
    runs = expand(
        load_suite("backbones"), strategies=["gr4cil", "gr4cil-laion400m"], weights="/w.pt", device="cpu"
    )
    assert {(r.label, r.backbone["model"], r.backbone["pretrained"]) for r in runs} == {
        ("gr4cil", "ViT-B-16-quickgelu", "/w.pt"),
        ("gr4cil-laion400m", "ViT-B-16", "/w.pt"),
    }


def _suite(tmp_path, backbone: str):
    path = tmp_path / "rows.toml"
    path.write_text(
        'datasets = ["cifar100"]\ntasks = [10]\nseeds = [0]\nstrategies = ["finetune", "ft-other"]\n'
        f'[variants.ft-other]\nstrategy = "finetune"\nbackbone = {backbone}\n',
        encoding="utf-8",
    )
    return str(path)


@pytest.mark.parametrize(
    "backbone, words",
    [
        ('{model = "ViT-B-16", pretrained = "openai"}', "use model = 'ViT-B-16-quickgelu'"),
        ('{model = "ViT-B-16", pretrained = "laion400m"}', "did you mean laion400m_e32"),
        ('{pretrained = "laion400m_e32"}', "use model = 'ViT-B-16'"),  # over the default -quickgelu model
        ('{model = "ViT-B-16", weights = "x"}', "unknown key(s) ['weights']"),
        ('"ViT-B-16"', "must be a table"),
    ],
)
def test_a_rows_backbone_is_checked_against_open_clips_registry_in_one_line(tmp_path, backbone, words):
    with pytest.raises(UserError) as info:
        load_suite(_suite(tmp_path, backbone))
    message = str(info.value)
    assert "\n" not in message and "[variants.ft-other] backbone" in message and words in message


def test_a_rows_random_backbone_is_none(tmp_path):
    runs = expand(load_suite(_suite(tmp_path, '{model = "ViT-L-14", pretrained = "none"}')), device="cpu")
    assert [(r.label, r.backbone) for r in runs] == [
        ("finetune", OPENAI),
        ("ft-other", {"model": "ViT-L-14", "pretrained": None}),
    ]


def test_a_run_records_its_weight_files_sha256_outside_its_hash(tmp_path):
    from benchmarks.runner.building import resolve
    from benchmarks.runner.result_record import config_hash
    from tests.helpers import MINI_SUITE, write_suite

    suite = load_suite(write_suite(tmp_path / "mini.toml", MINI_SUITE))
    recorded = []
    for content in (b"one file", b"another file"):
        weights = tmp_path / content.decode().replace(" ", "-")
        weights.write_bytes(content)
        (spec,) = expand(suite, strategies=["finetune"], weights=str(weights), device="cpu")
        config = resolve(spec, "data").config
        assert config["backbone"] == {"model": "tiny-clip-32", "pretrained": str(weights)}
        recorded.append((config["weights_file"], config_hash({**config, "backbone": None})))
    (first, first_hash), (second, second_hash) = recorded
    assert first == {"file": "one-file", "sha256": hashlib.sha256(b"one file").hexdigest()}
    assert second["sha256"] == hashlib.sha256(b"another file").hexdigest()
    assert first_hash == second_hash  # the file's digest is recorded, not hashed
    (synthetic,) = expand(suite, strategies=["finetune"], device="cpu")
    assert len(resolve(synthetic, "data").config["weights_file"]["sha256"]) == 64  # the shipped file's
