"""The field's suites (``lamda``, ``lamda-half-base``, ``ptm``): every run resolves (each strategy's
recipe has a value for every dataset), and each dataset's tasks are its papers' split, sized by hand
from PROOF's and APER's experiment files (docs/decisions.md D14, D17)."""

import pytest

from benchmarks.runner.building import resolve
from benchmarks.runner.suites import expand, load_suite

# dataset -> (split as the config records it, task sizes): "" for equal tasks
LAMDA = {
    "cifar100": ("", [10] * 10),
    "cub200": ("", [20] * 10),
    "imagenet_r": ("", [20] * 10),
    "objectnet": ("", [20] * 10),
    "cars196": ("", [10] * 10),  # the LAMDA family's 100 classes (layout = "lamda")
    "ucf101": ("", [10] * 10),
    "aircraft": ("", [10] * 10),
    "food100": ("", [10] * 10),
    "sun397": ("", [30] * 10),  # C3Box's 300 classes
}
LAMDA_HALF = {
    "cifar100": ("B50-Inc10", [50] + [10] * 5),
    "cub200": ("B100-Inc20", [100] + [20] * 5),
    "imagenet_r": ("B100-Inc20", [100] + [20] * 5),
    "objectnet": ("B100-Inc20", [100] + [20] * 5),
    "cars196": ("B50-Inc10", [50] + [10] * 5),
    "ucf101": ("B50-Inc10", [50] + [10] * 5),
    "aircraft": ("B50-Inc10", [50] + [10] * 5),
    "food100": ("B50-Inc10", [50] + [10] * 5),
    "sun397": ("B150-Inc30", [150] + [30] * 5),
}
PTM = {
    "cifar100": ("", [5] * 20),
    "cub200": ("", [10] * 20),
    "imagenet_r": ("", [5] * 40),
    "imagenet_a": ("", [10] * 20),
    "objectnet": ("", [10] * 20),
    "tinyimagenet": ("B100-Inc10", [100] + [10] * 10),
}


@pytest.mark.parametrize("name, expected", [("lamda", LAMDA), ("lamda-half-base", LAMDA_HALF), ("ptm", PTM)])
def test_each_dataset_runs_at_its_papers_split_with_every_strategy(name, expected):
    specs = expand(load_suite(name), seeds=[0])
    assert {s.dataset for s in specs} == set(expected)
    assert {s.strategy for s in specs} == set(load_suite("main")["strategies"])  # every method of main
    for spec in specs:
        split, sizes = expected[spec.dataset]
        assert (spec.config.get("split", ""), spec.n_tasks) == (split, len(sizes)), spec.key
        assert spec.key.stem == (f"{split}-" if split else "") + f"T{len(sizes)}-seed0"
        run = resolve(spec, "data")  # every option of the recipe resolves for this dataset
        assert run.config["class_order"] == "seed1993"


def test_the_tasks_sizes_follow_pycils_rule_on_each_class_count():
    from benchmarks.data.splits import split_sizes

    for table in (LAMDA_HALF, PTM):
        for dataset, (split, sizes) in table.items():
            if split:
                assert split_sizes(split, sum(sizes), dataset) == sizes
