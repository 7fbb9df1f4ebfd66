"""smoke-baselines runs every strategy on its official CIFAR-100 recipe (issue 21, item 2).

Every resolved hyper-parameter of a smoke-baselines run equals that of the same strategy's CIFAR-100
run of the main suite, except where one of the suite file's three rules, the same for every method,
adapts it to the miniature. A new strategy in both suites is covered without edits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.data.protocols import PROMPTS, SOURCES
from benchmarks.runner.building import resolve
from benchmarks.runner.suites import expand, load_suite

SIZE_FIELDS = {"lora_rank", "lora_alpha", "e_layers", "g_layers", "prompt_layers", "components"}  # rule 3
NOT_RECIPE = {"eval_batch_size", "num_workers"}  # how a run is evaluated and loaded, not how it trains
STEP_FIELDS = {"warmup_steps"}  # rule 1: a tenth of the official steps
SCALED_AUGMENTATION = {"paper": "paper-scaled"}  # rule 2
# rule 4: a template that a source's protocol gives a real dataset (benchmarks/data/protocols.py
# PROMPTS) is a fact of that dataset; the synthetic world has none and keeps the protocol's own
PROTOCOL_TEMPLATE = "a photo of a {}."


def _resolved(suite_name: str, dataset: str) -> dict[str, dict]:
    """Each strategy's resolved config in a 10-task run of ``suite_name`` on ``dataset``."""
    suite = load_suite(suite_name)
    specs = expand(suite, datasets=[dataset], tasks=[10], seeds=[0])
    return {spec.strategy: resolve(spec, data_root=".").config["strategy_config"] for spec in specs}


@pytest.fixture(scope="module")
def recipes() -> tuple[dict[str, dict], dict[str, dict]]:
    return _resolved("main", "cifar100"), _resolved("smoke-baselines", "synthetic")


def test_smoke_baselines_runs_the_main_suites_strategies(recipes):
    official, miniature = recipes
    assert set(miniature) == set(official)


@pytest.mark.parametrize("strategy", sorted(load_suite("smoke-baselines")["strategies"]))
def test_every_recipe_field_is_official_or_converted_by_a_named_rule(recipes, strategy):
    official, miniature = recipes[0][strategy], recipes[1][strategy]
    assert set(official) == set(miniature)
    for field, value in official.items():
        got = miniature[field]
        if field in SIZE_FIELDS | NOT_RECIPE:
            continue
        if field in STEP_FIELDS:
            assert got == round(value / 10), (strategy, field, got, value)
        elif field == "train_augmentation":
            assert got == SCALED_AUGMENTATION.get(value, value), (strategy, got, value)
        elif field == "prompt_template" and strategy in PROMPTS:
            assert (
                got == PROTOCOL_TEMPLATE
                and value == SOURCES[PROMPTS[strategy]["cifar100"]]["cifar100"].prompt_template
            )
        else:
            assert got == value, f"{strategy}.{field}: smoke-baselines {got!r}, CIFAR-100 recipe {value!r}"


def _scaled(config: dict, scale: float) -> dict:
    """``config`` with its epochs times the suite's ``epoch_scale``: rounded, at least one, 0 kept."""
    return {**config, "epochs": max(1, round(config["epochs"] * scale)) if config["epochs"] else 0}


def test_the_smoke_runs_smoke_baselines_recipes_with_one_common_epoch_factor(recipes):
    """The smoke's only departure from smoke-baselines is the suite's epoch_scale, alike for all."""
    scale = load_suite("smoke")["epoch_scale"]
    baselines, smoke = recipes[1], _resolved("smoke", "synthetic")
    for strategy, config in smoke.items():
        assert config == _scaled(baselines[strategy], scale), strategy


def _write_suite(tmp_path, scale) -> str:
    path = tmp_path / "scaled.toml"
    path.write_text(f"""datasets = ["synthetic"]
tasks = [10]
seeds = [0]
strategies = ["continual_clip", "finetune", "gr4cil"]
epoch_scale = {scale}
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[strategy.finetune]
epochs = 12
[strategy.gr4cil]
epochs = 70
""")
    return str(path)


def test_epoch_scale_rounds_keeps_at_least_one_epoch_and_names_itself(tmp_path):
    specs = {spec.strategy: spec for spec in expand(load_suite(_write_suite(tmp_path, 0.05)), device="cpu")}
    resolved = {name: resolve(spec, data_root=".") for name, spec in specs.items()}
    epochs = {name: r.strategy_cfg.epochs for name, r in resolved.items()}
    assert epochs == {"continual_clip": 0, "finetune": 1, "gr4cil": 4}  # 0 stays; 0.6 -> 1; 3.5 -> 4
    assert resolved["gr4cil"].config["option_sources"]["epochs"] == "strategy.gr4cil x epoch_scale 0.05"
    assert resolved["gr4cil"].config["epoch_scale"] == 0.05  # in the hashed config


@pytest.mark.parametrize("scale", ["0", "1.5", '"half"', "true"])
def test_an_epoch_scale_outside_0_1_is_a_one_line_user_error(tmp_path, scale):
    from benchmarks.core.errors import UserError

    with pytest.raises(UserError, match="epoch_scale must be a number in"):
        load_suite(_write_suite(tmp_path, scale))


def test_the_shipped_checkpoints_digest_joins_the_hashed_config(tmp_path):
    """A re-pretrained synthetic checkpoint changes every run's hash, so no older result is reused."""
    import hashlib

    from benchmarks.backbone import SYNTHETIC_WEIGHTS

    (spec,) = expand(load_suite("smoke"), strategies=["gr4cil"], device="cpu")
    config = resolve(spec, data_root=".").config
    expected = hashlib.sha256(SYNTHETIC_WEIGHTS.read_bytes()).hexdigest()[:16]
    assert config["backbone"] == {**spec.backbone, "weights_sha256": expected}
    # weights given as a file are named by their path, as before
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(SYNTHETIC_WEIGHTS.read_bytes())
    (by_path,) = expand(load_suite("smoke"), strategies=["gr4cil"], device="cpu", weights=str(weights))
    assert resolve(by_path, data_root=".").config["backbone"] == {
        "model": "tiny-clip-32",
        "pretrained": str(weights),
    }


@pytest.mark.parametrize("model, heads", [("tiny-clip-32-512", (4, 4)), ("tiny-clip-32-512-h64", (2, 1))])
def test_the_512_d_tiny_clips_are_synthetic_checkpoints_of_their_own(model, heads):
    """``tiny-clip-32-512`` (and its twin with 64-wide heads) with ``pretrained = "synthetic"`` loads
    its own shipped file, whose digest joins the hashed config as the 256-d one's does; 512-d
    features, as CLIP ViT-B/16's, and the heads of its config (image tower, text tower)."""
    import hashlib

    from benchmarks.backbone import SYNTHETIC_CHECKPOINTS, BackboneSpec, check_names, create_clip

    check_names(model, "synthetic")  # not an open_clip tag, and no error
    suite = load_suite("smoke")
    suite["backbone"] = {"model": model, "pretrained": "synthetic"}
    (spec,) = expand(suite, strategies=["gr4cil"], device="cpu")
    config = resolve(spec, data_root=".").config
    shipped = SYNTHETIC_CHECKPOINTS[model]
    assert config["backbone"]["weights_sha256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()[:16]
    assert config["weights_file"]["file"] == shipped.name
    backbone = create_clip(BackboneSpec(model, "synthetic"))
    assert backbone.encode_text(backbone.tokenize(["a photo of a red triangle."])).shape == (1, 512)
    towers = (backbone.model.visual.transformer, backbone.model.transformer)
    assert tuple(t.resblocks[0].attn.num_heads for t in towers) == heads


def test_the_ablation_suites_full_gr4cil_row_is_the_smokes_run():
    (full,) = expand(load_suite("smoke-ablation"), strategies=["gr4cil"], device="cpu")
    (smoke,) = expand(load_suite("smoke"), strategies=["gr4cil"], device="cpu")
    assert resolve(full, ".").config_hash == resolve(smoke, ".").config_hash


FRAMEWORKS = Path(__file__).resolve().parents[2] / "examples" / "frameworks"
SIDE_BY_SIDE = str(FRAMEWORKS / "side-by-side.toml")
C3BOX_SOURCES = (str(FRAMEWORKS / "c3box-smoke.toml"), str(FRAMEWORKS / "c3box-ptm.toml"))


def test_the_side_by_side_suite_runs_each_method_as_its_own_suite_does(recipes):
    """examples/frameworks/side-by-side.toml sets the suite's methods beside C3Box's learners on one
    protocol: the suite's own on smoke-baselines' recipes times the smoke's epoch_scale (as the smoke
    runs them), each C3Box learner on its table in c3box-smoke.toml or c3box-ptm.toml, unchanged,
    and the world, class order and tiny CLIP of c3box-ptm.toml, where those learners ran first."""
    side = load_suite(SIDE_BY_SIDE)
    ptm = load_suite(C3BOX_SOURCES[1])
    for key in ("datasets", "tasks", "class_order", "epoch_scale", "backbone", "common"):
        assert side[key] == ptm[key], key
    assert set(ptm["seeds"]) <= set(side["seeds"])  # c3box-ptm's runs are reused, not recomputed
    assert side["dataset"]["synthetic"] == ptm["dataset"]["synthetic"]

    outside = [name for name in side["strategies"] if name.startswith("pycil:")]
    tables = {path: load_suite(path)["strategy"] for path in C3BOX_SOURCES}
    for name in outside:
        sources = [path for path, table in tables.items() if name in table]
        assert len(sources) == 1, (name, sources)
        assert side["strategy"][name] == tables[sources[0]][name], name

    ours = [name for name in side["strategies"] if ":" not in name]
    assert ours == load_suite("smoke-baselines")["strategies"]
    for spec in expand(side, strategies=ours, datasets=["synthetic"], tasks=[10], seeds=[0]):
        config = resolve(spec, data_root=".").config["strategy_config"]
        assert config == _scaled(recipes[1][spec.strategy], side["epoch_scale"]), spec.strategy
    assert len(ours) + len(outside) >= 20
