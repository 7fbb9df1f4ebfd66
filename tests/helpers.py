"""Helpers shared by the tests: small suites, a strategy built as the runner builds it, and runs
killed mid-stream and resumed. Imported as ``from tests.helpers import ...``."""

import json
import sys

import torch

from strategies.settings import RunSettings


def write_suite(path, text: str):
    path.write_text(text)
    return str(path)


def tiny_suite(strategies, tasks: int = 5, seeds=(0,), zero_shot_targets=()) -> str:
    """The first lines of a suite of ``strategies`` on the synthetic dataset in ``tasks`` tasks, with
    the tiny CLIP on the CPU; a test appends its ``[dataset.synthetic]``, ``[defaults]`` and other tables."""
    zero_shot = f"zero_shot_targets = {json.dumps(list(zero_shot_targets))}\n" if zero_shot_targets else ""
    return (
        f'\ndatasets = ["synthetic"]\ntasks = [{tasks}]\nseeds = {json.dumps(list(seeds))}\n'
        f'strategies = {json.dumps(list(strategies))}\ndevice = "cpu"\n{zero_shot}'
        '[backbone]\nmodel = "tiny-clip-32"\npretrained = "synthetic"\n'
    )


MINI_SUITE = (
    tiny_suite(["continual_clip", "finetune"])
    + """[dataset.synthetic]
n_train_per_class = 10
n_test_per_class = 4
[defaults]
batch_size = 32
eval_batch_size = 200
lora_rank = 4
lora_alpha = 4.0
[strategy.finetune]
epochs = 2
"""
)

#: MINI_SUITE with fewer images in smaller batches, for fp16 runs: fp16 on a CPU is emulated (minutes
#: where fp32 takes seconds), and what a loss scaler's state decides needs steps, not images
FP16_SUITE = (
    MINI_SUITE.replace("tasks = [5]", "tasks = [3]")  # a kill in task 3 leaves one to resume
    .replace("n_train_per_class = 10", "n_classes = 60\nn_train_per_class = 3")  # tasks of 20, as before
    .replace("n_test_per_class = 4", "n_test_per_class = 2")
    .replace("\nbatch_size = 32\n", "\nbatch_size = 20\n")
)
assert FP16_SUITE.count("= 3\n") == 1 and "tasks = [3]" in FP16_SUITE and "\nbatch_size = 20\n" in FP16_SUITE


def kill_in_task(monkeypatch, strategy_cls, task: int = 3):
    """Make ``strategy_cls.learn`` raise KeyboardInterrupt (a kill) when it starts task ``task``;
    call the returned function to let it learn normally again."""
    real_learn = strategy_cls.learn
    calls = {"n": 0}

    def dying_learn(self, experience):
        calls["n"] += 1
        if calls["n"] == task:
            raise KeyboardInterrupt
        return real_learn(self, experience)

    monkeypatch.setattr(strategy_cls, "learn", dying_learn)
    return lambda: monkeypatch.setattr(strategy_cls, "learn", real_learn)


def run_suite_here(root, text: str, *extra: str):
    """Write suite ``text`` under ``root`` and run it with the runner in this process; return the
    suite path and the results folder."""
    from benchmarks import run

    suite = root / "suite.toml"
    suite.write_text(text)
    results = root / "results"
    assert run.main(["--suite", str(suite), "--results-dir", str(results), "--quiet", *extra]) == 0
    return suite, results


def run_one_run_suite(root, text: str, *extra: str):
    """``run_suite_here`` for a suite of one run: the suite path, the results folder and the result."""
    from benchmarks.runner.reading import iter_results

    suite, results = run_suite_here(root, text, *extra)
    (result,) = [r for _, r in iter_results(results)]
    return suite, results, result


def killed_and_resumed(monkeypatch, strategy_cls, suite, results_dir, task: int) -> dict:
    """Run ``suite`` into ``results_dir``, killed when ``strategy_cls`` starts task ``task``, then
    again to the end (it resumes from the checkpoint); return the resumed result."""
    from benchmarks import run
    from benchmarks.runner.reading import iter_results

    revive = kill_in_task(monkeypatch, strategy_cls, task=task)
    argv = ["--suite", str(suite), "--results-dir", str(results_dir), "--quiet"]
    assert run.main(argv) == 130
    revive()
    assert run.main(argv) == 0
    (resumed,) = [r for _, r in iter_results(results_dir)]
    return resumed


def three_task_suite(strategy: str, options: str, augmentation: str = "paper-scaled") -> str:
    """A one-run suite: ``strategy`` on 15 faded synthetic classes in 3 tasks (8 train, 4 test
    images a class), with the ``[strategy.NAME]`` lines ``options`` (NAME quoted where TOML needs it)."""
    from benchmarks.runner.building import suite_table

    return (
        tiny_suite([strategy], tasks=3)
        + f"""[dataset.synthetic]
n_classes = 15
n_train_per_class = 8
n_test_per_class = 4
domain = "faded"
train_augmentation = "{augmentation}"
{suite_table(f"strategy.{strategy}")}
{options}
"""
    )


def strategy_from_suite(suite, **options):
    """A fresh strategy as the runner builds it for the first run of ``suite`` (tiny CLIP, shipped
    weights), with config fields ``options`` changed; also the run's spec and its data."""
    from benchmarks.backbone import BackboneSpec, create_clip
    from benchmarks.runner import building
    from benchmarks.runner.suites import expand, load_suite

    spec = expand(load_suite(str(suite)))[0]
    resolved = building.resolve(spec, "data")
    strategy_cls, config = resolved.strategy_cls, resolved.strategy_cfg
    for key, value in options.items():
        setattr(config, key, value)
    data = building.load_run_data(spec, "data")
    strategy = strategy_cls(
        backbone=create_clip(BackboneSpec(spec.backbone["model"], spec.backbone["pretrained"])),
        class_names=data.class_names,
        config=config,
        settings=RunSettings(show_progress=False),
    )
    return strategy, spec, data


def strategy_and_stream(root, text: str, n_tasks: int = 3):
    """A fresh strategy for the first run of suite ``text`` (written under ``root``) and its stream
    in the suite's class order 0..C-1, both splits under the eval transform."""
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import eval_transform

    path = root / "strategy-suite.toml"
    path.write_text(text)
    strategy, _, data = strategy_from_suite(path)
    backbone = strategy.backbone
    transform = eval_transform(backbone.image_size, backbone.mean, backbone.std)
    return strategy, build_stream(data, n_tasks, list(range(len(data.class_names))), transform, transform)


def check_save_load_and_resume(run, strategy_cls, tmp_path, monkeypatch):
    """For a finished ``run_one_run_suite(..., "--save-models")``: two strategies loaded from the
    saved model score alike, and a run killed at task 2 resumes to the same stages. Returns one of
    the loaded strategies."""
    import torch

    from benchmarks.runner.results import safe_label

    suite, results, reference = run
    first, _, _ = strategy_from_suite(suite)
    second, _, _ = strategy_from_suite(suite)
    saved = (
        results
        / reference["dataset"]
        / safe_label(reference["label"])
        / f"T{reference['n_tasks']}-seed{reference['seed']}.model"
    )
    for strategy in (first, second):
        strategy.load_model(saved)
    images = torch.randn(5, 3, 32, 32)
    assert len(first.seen_classes) == len(reference["class_order"])
    assert torch.equal(first.scores(images), second.scores(images))
    resumed = killed_and_resumed(monkeypatch, strategy_cls, suite, tmp_path / "resumed", task=2)
    assert resumed["stages"] == reference["stages"]
    return first


def numbers_of_runs(results_dir) -> dict:
    """What a run found, per strategy: every stage, the summary, the diagnostics (no config, env, cost)."""
    import json

    from benchmarks.runner.reading import iter_results

    return {
        r["strategy"]: json.dumps(
            {k: r.get(k) for k in ("stages", "summary", "diagnostics", "zero_shot")}, sort_keys=True
        )
        for _, r in iter_results(results_dir)
    }


def result_of(results_dir, label: str) -> dict:
    """The result labelled ``label`` under ``results_dir``."""
    from benchmarks.runner.reading import iter_results

    return next(r for _, r in iter_results(results_dir) if r["label"] == label)


def runner_command(suite, results_dir, *extra: str) -> list[str]:
    """The command line that runs ``suite`` into ``results_dir`` in a fresh Python process."""
    return [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--suite",
        str(suite),
        "--results-dir",
        str(results_dir),
        "--quiet",
        *extra,
    ]


def tiny_strategy(cls, stream, precision: str = "fp32", **config):
    """A fresh ``cls`` on the tiny CLIP (seed 0) for ``stream``'s classes: batches of 16, a rank-4
    LoRA, one epoch (none for Continual-CLIP, which trains nothing), and config fields ``config``."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.methods.continual_clip import ContinualCLIP

    torch.manual_seed(0)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    options = {
        "batch_size": 16,
        "eval_batch_size": 16,
        "lora_rank": 4,
        "lora_alpha": 4.0,
        **({} if cls is ContinualCLIP else {"epochs": 1}),
        **config,
    }
    return cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=cls.Config(**options),
        settings=RunSettings(precision=precision, show_progress=False),
    )


def seeded_order_stream(data, n_tasks: int = 10):
    """The 100 classes of ``data`` in ``n_tasks`` tasks of the seeded class order, under the
    32-pixel train and eval transforms."""
    from benchmarks.data.class_orders import seeded_order
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import eval_transform, train_transform

    return build_stream(data, n_tasks, seeded_order(100), train_transform(32), eval_transform(32))


def small_stream(order: list[int]):
    """12 synthetic classes in 3 tasks of 4 (6 training and 3 test images a class) in ``order``,
    every image under the 32-px eval transform: the adapters' tests' stream."""
    from benchmarks.data.datasets import load_dataset
    from benchmarks.data.streams import build_stream
    from benchmarks.data.transforms import eval_transform

    data = load_dataset("synthetic", n_classes=12, n_train_per_class=6, n_test_per_class=3)
    transform = eval_transform(32)
    return build_stream(data, 3, order, transform, transform)


def stacked_test_set(stream):
    """The stream's test images and labels as two tensors."""
    images, labels = zip(*[stream.test_set[i][:2] for i in range(len(stream.test_set))])
    return torch.stack(images), torch.tensor(labels)


def assert_mg_clips_imagenet_r_protocol(result: dict) -> None:
    """``result`` ran fake ImageNet-R under main-as-published with MG-CLIP's protocol: its class order
    (first classes as MG-CLIP lists them) and its class names."""
    config = result["config"]
    assert (config["class_order"], config["protocol"]) == ("mg_clip_imagenet_r", "as-published")
    assert result["class_order"][:3] == [150, 119, 193] and "great_white_shark" in result["class_names"]
