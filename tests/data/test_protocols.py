"""The shipped protocol data (RAPF's ImageNet-R split, MG-CLIP's order and names) and the
per-strategy protocols of main and main-as-published, resolved as docs/baselines.md §3 writes them."""

import json
from collections import Counter
from importlib import resources

import pytest

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.class_orders import named_orders, resolve_class_order
from benchmarks.data.datasets import imagenet_wnid_names, load_dataset, read_split_list
from benchmarks.data.protocols import PUBLISHED_ROWS, SOURCES, protocol_layer
from benchmarks.data.units.imagenet_r import mg_clip_imagenet_r_names, rapf_split_list
from benchmarks.runner.building import resolve
from benchmarks.runner.suites import expand, load_suite
from strategies.cards import card_of


@pytest.fixture
def fake_cifar_and_imagenet_r(fake_root):
    """Fake CIFAR-100 and ImageNet-R, 2 training and 1 test image a class, in the run's one fake
    data root (tests/conftest.py, with the other datasets)."""
    assert (fake_root / "cifar-100-python").is_dir() and (fake_root / "imagenet-r").is_dir()
    return fake_root


def imagenet_r_wnids() -> list[str]:
    return json.loads((resources.files("benchmarks") / "assets" / "imagenet_r_wnids.json").read_text())


def test_the_shipped_rapf_split_has_24000_train_and_6000_test_images_of_200_classes_without_overlap():
    lists = rapf_split_list()
    train, test = lists["train"], lists["test"]
    assert (len(train), len(test)) == (24_000, 6_000)
    assert len(set(train)) == 24_000 and len(set(test)) == 6_000 and not set(train) & set(test)
    assert all(path.endswith(".jpg") for path in train + test)  # the stray test_img_R.py is gone
    wnids = set(imagenet_r_wnids())
    for part in (train, test):
        classes = Counter(path.split("/")[0] for path in part)
        assert set(classes) == wnids and len(classes) == 200
    assert train[0] == "n02051845/art_0.jpg" and test[0] == "n02051845/tattoo_4.jpg"  # the file's first lines


def test_a_split_list_in_rapfs_text_format_drops_what_is_not_an_image():
    text = "train\nn01/a.jpg\nn01/b.png\ntest\nn01/c.jpg\nn01/test_img_R.py\n"
    assert read_split_list(text, "x") == {"train": ["n01/a.jpg", "n01/b.png"], "test": ["n01/c.jpg"]}
    assert read_split_list('{"train": ["a.jpg"], "test": ["b.JPEG"]}', "x") == {
        "train": ["a.jpg"],
        "test": ["b.JPEG"],
    }
    with pytest.raises(UserError, match="neither JSON"):
        read_split_list("test\na.jpg\ntrain\nb.jpg\n", "x")


@pytest.mark.parametrize("name", list(named_orders()))
def test_every_named_order_is_a_permutation_of_its_datasets_classes(name):
    dataset, order = named_orders()[name]
    n_classes = {"cifar100": 100, "imagenet_r": 200, "tinyimagenet": 200}[dataset]
    assert sorted(resolve_class_order(name, n_classes, dataset)) == list(range(n_classes))
    with pytest.raises(UserError, match="does not apply"):
        resolve_class_order(name, 1000, "imagenet1k")


def test_mg_clips_imagenet_r_order_is_its_yaml_list():
    assert resolve_class_order("mg_clip_imagenet_r", 200, "imagenet_r")[:6] == [150, 119, 193, 2, 75, 179]
    assert resolve_class_order("mg_clip_imagenet_r", 200, "imagenet_r")[-3:] == [118, 48, 175]


def test_mg_clips_imagenet_r_names_cover_the_200_wnids_and_differ_from_openais_where_counted():
    names = mg_clip_imagenet_r_names()
    assert list(names) == imagenet_r_wnids() and len(names) == 200
    openai = imagenet_wnid_names()
    assert names["n01494475"] == "hammerhead" and openai["n01494475"] == "hammerhead shark"
    # counted by hand from the two lists: 91 differ as written, 56 once underscores become spaces
    assert sum(names[w] != openai[w] for w in names) == 91
    assert sum(names[w].replace("_", " ") != openai[w] for w in names) == 56


def test_the_name_sets_give_each_dataset_its_class_count(fake_cifar_and_imagenet_r):
    root = fake_cifar_and_imagenet_r
    raw = load_dataset("cifar100", root, class_names="torchvision").class_names
    clean = load_dataset("cifar100", root).class_names
    assert len(raw) == len(clean) == 100 and "aquarium_fish" in raw and "aquarium fish" in clean
    mg = load_dataset("imagenet_r", root, class_names="mg_clip").class_names
    assert len(mg) == 200 and mg[:3] == ["goldfish", "great_white_shark", "hammerhead"]
    with pytest.raises(UserError, match="class_names='x' is not one of"):
        load_dataset("imagenet_r", root, class_names="x")


def test_both_imagenet_r_splits_walk_on_fake_data_named_as_the_list(fake_cifar_and_imagenet_r):
    listed = load_dataset("imagenet_r", fake_cifar_and_imagenet_r)  # split = "rapf"
    stratified = load_dataset("imagenet_r", fake_cifar_and_imagenet_r, split="stratified")
    assert len(listed.train) == 400 and len(listed.test) == 200  # 2 + 1 of each class (the fixture)
    assert len(stratified.train) + len(stratified.test) == 600
    test_files = {path.split("imagenet-r/")[1] for path, _ in listed.test.samples}
    assert test_files <= set(rapf_split_list()["test"])


def test_the_rapf_split_on_a_real_root_names_the_missing_image(tmp_path):
    first_of_class = {}
    for path in rapf_split_list()["train"]:
        first_of_class.setdefault(path.split("/")[0], path)
    for path in first_of_class.values():  # one listed image of each class, and no FAKE_DATA marker
        (tmp_path / "imagenet-r" / path).parent.mkdir(parents=True)
        (tmp_path / "imagenet-r" / path).write_bytes(b"")
    with pytest.raises(
        DataNotFoundError, match=r"lists 23800 train image\(s\) not found .*prepare imagenet_r"
    ):
        load_dataset("imagenet_r", tmp_path)


# (strategy, dataset) -> (class order, dataset options, prompt template or None for the recipe's),
# written from the sources' files (docs/baselines.md §3), not from benchmarks/data/protocols.py
BAD, GOOD = "a bad photo of a {}.", "a good photo of a {}."
MG_CIFAR = ("dytox", {"class_names": "torchvision"})
MG_IMAGENET_R = ("mg_clip_imagenet_r", {"split": "rapf", "class_names": "mg_clip"})
AS_PUBLISHED = {
    ("continual_clip", "cifar100"): (*MG_CIFAR, BAD),
    ("continual_clip", "imagenet_r"): (*MG_IMAGENET_R, GOOD),
    **{(s, "cifar100"): (*MG_CIFAR, None) for s in ("mg_clip", "moe4cl", "magmax", "l2p_pp", "clap")},
    **{(s, "imagenet_r"): (*MG_IMAGENET_R, None) for s in ("dualprompt", "coda_prompt", "aper_adapter")},
}
MAIN = {
    ("continual_clip", "cifar100"): ("seed1993", {}, BAD),
    ("continual_clip", "imagenet_r"): ("seed1993", {"split": "rapf"}, GOOD),
    ("continual_clip", "imagenet100"): ("seed1993", {}, GOOD),
    ("continual_clip", "imagenet1k"): ("seed1993", {}, GOOD),
    ("gr4cil", "imagenet_r"): ("seed1993", {"split": "rapf"}, None),
    ("mg_clip", "cifar100"): ("seed1993", {}, None),
}


@pytest.mark.parametrize(("suite", "expected"), [("main-as-published", AS_PUBLISHED), ("main", MAIN)])
def test_each_row_resolves_to_its_sources_protocol(suite, expected):
    runs = {(r.strategy, r.dataset): r for r in expand(load_suite(suite), device="cpu", seeds=[0])}
    for (strategy, dataset), (order, options, template) in expected.items():
        run = runs[(strategy, dataset)]
        assert (run.class_order, run.dataset_options) == (order, options), (strategy, dataset)
        assert run.strategy_options.get("prompt_template") == template, (strategy, dataset)
        assert run.config["protocol"] == suite.replace("main-as-published", "as-published").replace(
            "main", "one-protocol"
        )


def test_as_published_runs_only_the_rows_whose_protocol_differs_from_mains():
    suite = load_suite("main-as-published")
    assert set(suite["datasets"]) == {"cifar100", "imagenet_r"}
    assert not {"gr4cil", "adaptervlm", "finetune"} & set(suite["strategies"])
    assert set(suite["strategies"]) == set(PUBLISHED_ROWS)
    for strategy in suite["strategies"]:  # main's recipes: only the protocol and the official code differ
        main = {
            r.dataset: r for r in expand(load_suite("main"), strategies=[strategy], device="cpu", seeds=[0])
        }
        official = card_of(strategy).official_options
        for run in expand(suite, strategies=[strategy], device="cpu", seeds=[0]):
            assert run.strategy_options == {**main[run.dataset].strategy_options, **official}
            assert resolve(run, ".").config_hash != resolve(main[run.dataset], ".").config_hash


#: every official behaviour of docs/decisions.md D4, as the resolved option that turns it on
OFFICIAL_BEHAVIOURS = {
    "l2p_pp": {"key_loss": "all_pairs", "drop_last": True},
    "dualprompt": {"keys": "per_layer", "select_over": "pool", "drop_last": True},
    "coda_prompt": {"gram_schmidt": "official", "drop_last": True},
    "moe4cl": {"eval_gate_noise": True},
    "clap": {"vga_context": "batch", "eval_noise": "batch", "train_vga_context": "batch"},
}
#: the ones the defaults leave off, because a score would depend on the evaluation batch or on chance
CLEAN_DEFAULTS = {
    "moe4cl": {"eval_gate_noise": False},
    "clap": {"vga_context": "image", "eval_noise": "stage"},
}


def test_main_as_published_runs_every_row_with_its_official_code_and_main_with_the_clean_defaults():
    from benchmarks.runner.building import resolve

    for suite_name in ("main", "main-as-published"):
        suite = load_suite(suite_name)
        for run in expand(suite, device="cpu", seeds=[0]):
            if run.strategy not in OFFICIAL_BEHAVIOURS:
                continue
            resolved = resolve(run, "data").config["strategy_config"]
            expected = dict(OFFICIAL_BEHAVIOURS[run.strategy])
            if suite_name == "main":
                expected.update(CLEAN_DEFAULTS.get(run.strategy, {}))
            got = {name: resolved[name] for name in expected}
            assert got == expected, (suite_name, run.strategy, run.dataset)


def test_on_imagenet_100_and_1k_every_source_protocol_is_mains():
    for source in SOURCES.values():
        for dataset in ("imagenet100", "imagenet1k"):
            if dataset in source:
                assert source[dataset].class_order == "seed1993" and source[dataset].dataset_options == {}


def test_a_strategy_without_a_published_row_keeps_the_suites_protocol():
    layer = protocol_layer("as-published", "gr4cil", "cifar100")
    assert layer.class_order is None and layer.dataset_options == {} and layer.strategy_options == {}
    with pytest.raises(UserError, match="unknown protocol"):
        protocol_layer("mine", "gr4cil", "cifar100")


def test_a_suite_starts_from_its_base_and_a_table_may_set_a_strategys_class_order(tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text(
        'base = "smoke"\nseeds = [4]\nstrategies = ["continual_clip", "finetune"]\n'
        '[strategy.finetune]\nclass_order = "seed7"\nlr = 0.5\n'
    )
    runs = {r.strategy: r for r in expand(load_suite(str(suite)), device="cpu")}
    smoke = {r.strategy: r for r in expand(load_suite("smoke"), device="cpu", seeds=[4])}
    assert runs["continual_clip"].config == smoke["continual_clip"].config  # nothing else changed
    assert runs["finetune"].class_order == "seed7" and runs["finetune"].strategy_options["lr"] == 0.5
    assert "class_order" not in runs["finetune"].strategy_options  # a run setting, not the strategy's
    assert runs["finetune"].strategy_options["epochs"] == smoke["finetune"].strategy_options["epochs"]
    overridden = expand(load_suite(str(suite)), device="cpu", strategies=["finetune"], class_order="seed9")
    assert overridden[0].class_order == "seed9"  # the command line wins over every table


def test_a_missing_or_circular_base_is_one_line(tmp_path, monkeypatch):
    from benchmarks.runner import suites

    smoke = (suites.SUITES_DIR / "smoke.toml").read_text()
    (tmp_path / "a.toml").write_text('base = "b"\n')
    (tmp_path / "b.toml").write_text('base = "a"\n')
    (tmp_path / "c.toml").write_text('base = "nowhere"\n')
    monkeypatch.setattr(suites, "SUITES_DIR", tmp_path)
    with pytest.raises(UserError, match="makes a circle"):
        load_suite(str(tmp_path / "a.toml"))
    with pytest.raises(UserError, match="base suite 'nowhere' does not exist"):
        load_suite(str(tmp_path / "c.toml"))
    (tmp_path / "d.toml").write_text('protocol = "mine"\n' + smoke)
    with pytest.raises(UserError, match="unknown protocol 'mine'"):
        load_suite(str(tmp_path / "d.toml"))
