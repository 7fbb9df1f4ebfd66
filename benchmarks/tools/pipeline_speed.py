"""Training and evaluation images per second of the real runner, against the bare reference beside it.

``python -m benchmarks.tools.pipeline_speed [--strategies finetune,gr4cil] [--device cuda]`` measures
what a run of a real suite costs, by the runner's own path rather than a step in isolation:

1. fake data in the dataset's real format (``benchmarks.tools.fake_data``: CIFAR-100's pickles by
   default, ``--train-per-class`` and ``--test-per-class`` images a class) in a temporary folder
   (or ``--data-root``);
2. each strategy's run of the ``main`` suite on it (``load_suite`` and ``expand``, with the tasks,
   epochs, model, device, batch size and loader workers given here), built by
   ``benchmarks.runner.building.build_run`` (its loaders, workers, resized cache where one was
   built, augmentation where the runner puts it) and learned by the runner's own task loop
   (``learning.learn_tasks``: ``strategy.learn`` a task, evaluate every test image as a stage,
   checkpoint, as in a real run);
3. ``train``: images over the seconds of every whole training epoch of every task (a plugin stamps
   ``before_training_epoch`` and ``after_training_epoch``: the loader's workers starting, every
   step and the epoch's bookkeeping, not ``setup_task`` or ``finish_task``); ``eval``: the test
   images of every stage over the runner's evaluation seconds of the stages;
4. the reference (``benchmarks.tools.reference``: plain open_clip and torch) measured beside it in
   the same process, device and precision: ``step``, a training step with the strategy's trainable
   set built plainly on a batch of its last task (``reference_pairing.trainable_set``), and ``forward``,
   ``encode_image`` without grad at the eval batch size.

``train / ref step`` and ``eval / forward`` say how near the runner comes to the hardware. The
defaults fit the CPU (the tiny CLIP with its synthetic weights, 50 and 10 images a class, no loader
workers, one torch thread: the runner's own choices there); on CUDA they are a randomly initialised
ViT-B/16, 500 and 100 images a class (CIFAR-100's real size) and the suite's workers. A mistake in
the input (an unknown strategy or dataset, a count below 1) prints one line and exits with code 2.
Results print as a Markdown table and go to ``--out`` as JSON.
"""

from __future__ import annotations

import dataclasses
import datetime
import tempfile
import time
from pathlib import Path

import torch
from avalanche.core import SupervisedPlugin
from tqdm.auto import tqdm

from benchmarks.backbone import TINY_MODEL
from benchmarks.core.environment import check_threads, set_threads
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.core.precision import PRECISIONS
from benchmarks.runner.building import build_run, resolve
from benchmarks.runner.execute import preflight
from benchmarks.runner.learning import RunContext, learn_tasks
from benchmarks.runner.results import ResultStore, RunProgress
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.suites import expand, load_suite
from benchmarks.tools import reference
from benchmarks.tools.fake_data import fake_targets, make_fake_data
from benchmarks.tools.measuring import own_strategy, own_strategy_class
from benchmarks.tools.reference_pairing import StepProbe, probe_step, reference_model
from benchmarks.tools.speed_report import machine, outcome_of, published, table_number
from strategies.registry import get_strategy

SUITE = "main"
CUDA_MODEL = "ViT-B-16-quickgelu"
#: (train, test) images a class by default: small on the CPU, CIFAR-100's real size on CUDA
PER_CLASS = {"cpu": (50, 10), "cuda": (500, 100)}


def _wait_for(device: torch.device) -> None:
    """GPU kernels run asynchronously: a timestamp on CUDA waits for them to end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EpochTimer(SupervisedPlugin):
    """Sums the seconds and images of every whole training epoch. At the end of each epoch it
    probes the strategy as it trains (``reference_pairing.probe_step``, no op count: this is the real
    run) on the epoch's first largest batch, as the step saw it: the reference's batch."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs = 0
        self.images = 0
        self.seconds = 0.0
        self.probe = StepProbe()
        self.batch: list[torch.Tensor] | None = None  # of the latest epoch
        self._epoch_batch: list[torch.Tensor] | None = None
        self._start = 0.0

    def before_training_epoch(self, strategy, **kwargs) -> None:
        _wait_for(strategy.device)
        self._epoch_batch = None
        self._start = time.perf_counter()

    def after_training_iteration(self, strategy, **kwargs) -> None:
        self.images += len(strategy.mb_x)
        if self._epoch_batch is None or len(strategy.mb_x) > len(self._epoch_batch[0]):
            self._epoch_batch = strategy.mbatch

    def after_training_epoch(self, strategy, **kwargs) -> None:
        _wait_for(strategy.device)
        self.seconds += time.perf_counter() - self._start
        self.epochs += 1
        if self._epoch_batch is not None:
            self.batch = self._epoch_batch
            probe_step(self.probe, self.batch, count_ops=False)(strategy)

    @property
    def images_per_second(self) -> float | None:
        return self.images / self.seconds if self.seconds and self.images else None


@dataclasses.dataclass
class Options:
    reference_warmup: int = 3
    reference_steps: int = 10


def measure_run(spec: RunSpec, data_root: str, results_dir: Path, options: Options) -> dict:
    """Learn and evaluate every task of ``spec`` by the runner's path, timing whole epochs and whole
    stages, then measure the reference beside it (module docstring)."""
    resolved = resolve(spec, data_root)
    timer = EpochTimer()
    built = build_run(resolved, data_root, plugins=[timer])
    stream, strategy = built.stream, own_strategy(built.strategy)
    context = RunContext(resolved, ResultStore(results_dir), data_root, show_progress=False)
    progress = RunProgress()
    start = time.perf_counter()
    learn_tasks(context, stream, strategy, progress)
    learn_seconds = time.perf_counter() - start
    stages = len(progress.stages)
    eval_images = len(stream.test_set) * stages
    cost = progress.cost
    notes = []
    model = reference_model(spec)
    precision = strategy.settings.precision
    ref: dict = {"step_images_per_second": None, "step_kind": None}
    if timer.batch is not None and timer.probe.targets is not None:
        tokens = reference.tokenize(spec.backbone["model"], timer.probe.prompts, spec.device)
        ref = reference.measure_steps(
            model,
            timer.probe.trainable,
            timer.batch[0],
            timer.probe.targets,
            tokens,
            precision,
            options.reference_warmup,
            options.reference_steps,
        )
        if timer.probe.trainable.kind == "forward":
            notes.append("reference step is a forward alone: nothing it trains is in the backbone's forward")
    else:
        notes.append("trains nothing")
    eval_batch_size = strategy.eval_mb_size
    image_size = strategy.backbone.image_size
    eval_batch = torch.randn(eval_batch_size, 3, image_size, image_size, device=spec.device)
    forward = reference.forward_pass(model, precision)
    forward_repeats = max(3, -(-len(stream.test_set) // eval_batch_size))  # about one stage's batches
    ref_forward = reference.images_per_second(
        lambda: forward(eval_batch), eval_batch_size, 1, forward_repeats, spec.device
    )
    train = timer.images_per_second
    evaluation = eval_images / cost.eval_seconds if cost.eval_seconds else None
    ref_step = ref["step_images_per_second"]
    row = {
        "strategy": spec.label,
        "train_images_per_second": train,
        "eval_images_per_second": evaluation,
        "reference_step_images_per_second": ref_step,
        "reference_forward_images_per_second": ref_forward,
        "train_over_reference_step": train / ref_step if train and ref_step else None,
        "eval_over_forward": evaluation / ref_forward if evaluation else None,
        "epochs_timed": timer.epochs,
        "stages_timed": stages,
        "precision": precision,
        "batch_size": strategy.train_mb_size,
        "eval_batch_size": eval_batch_size,
        "num_workers": strategy.cfg.num_workers,
        "reference_step_kind": ref["step_kind"],
        "train_images": timer.images,
        "train_seconds": timer.seconds,
        "eval_images": eval_images,
        "eval_seconds": cost.eval_seconds,
        "learn_seconds": learn_seconds,  # every task's learn and evaluation, with the untimed parts
        "notes": notes,
    }
    return row


def run_specs(args) -> list[RunSpec]:
    """One run of the ``main`` suite per strategy on ``args.dataset`` (seed 0), with this command's
    tasks, epochs, model, batch size and loader workers."""
    suite = load_suite(SUITE)
    pretrained = "synthetic" if args.model == TINY_MODEL else "none"
    suite["backbone"] = {"model": args.model, "pretrained": pretrained}
    suite["defaults"] = {**suite.get("defaults", {}), "num_workers": args.num_workers}
    tables = suite.setdefault("strategy", {})
    for name in args.strategies:
        table = dict(tables.get(name, {}))
        if own_strategy_class(name).Config().epochs > 0:  # a strategy that trains nothing keeps its 0
            table["epochs"] = args.epochs
        if args.batch_size is not None:
            table["batch_size"] = args.batch_size
        tables[name] = table
    return expand(
        suite,
        strategies=args.strategies,
        datasets=[args.dataset],
        tasks=[args.tasks],
        seeds=[0],
        device=args.device,
        precision=args.precision,
    )


def markdown_table(results: dict) -> str:
    """The rows as a Markdown table, under a line that says when, where and on what."""
    host, setting = results["machine"], results["settings"]
    lines = [
        f"{results['date']}: {host['cpu_count']} CPU cores ({host['torch_threads']} torch threads), "
        f"{host['device']} ({host['device_name']}), {results['model']}, fake {setting['dataset']} "
        f"({setting['train_per_class']}/{setting['test_per_class']} images a class), "
        f"{setting['tasks']} tasks, {setting['epochs']} epochs, {setting['num_workers']} loader workers, "
        f"load average {host['load_average']:.1f}; ref = bare open_clip (benchmarks.tools.reference)",
        "",
        "| strategy | precision | batch | epochs | train img/s | ref step (kind) | train / ref step | stages "
        "| eval img/s | ref forward | eval / forward | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        kind = f" ({row['reference_step_kind']})" if row["reference_step_kind"] else ""
        cells = [
            row["strategy"],
            row["precision"],
            str(row["batch_size"]),
            str(row["epochs_timed"]),
            table_number(row["train_images_per_second"]),
            table_number(row["reference_step_images_per_second"]) + kind,
            table_number(row["train_over_reference_step"], ratio=True),
            str(row["stages_timed"]),
            table_number(row["eval_images_per_second"]),
            table_number(row["reference_forward_images_per_second"]),
            table_number(row["eval_over_forward"], ratio=True),
            "; ".join(row["notes"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_COUNTS = ("epochs", "tasks", "train_per_class", "test_per_class", "reference_steps")  # at least 1


@one_line_user_errors
def _command(argv: list[str] | None) -> dict:
    parser = CommandParser(
        prog="python -m benchmarks.tools.pipeline_speed", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--strategies",
        type=lambda text: [name for name in text.split(",") if name],
        default=["finetune"],
        help="comma-separated strategies (default: finetune)",
    )
    parser.add_argument("--dataset", default="cifar100", help="a dataset fake_data writes (default cifar100)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model",
        help=f"default {TINY_MODEL} (its synthetic weights) on the CPU, {CUDA_MODEL} (random) on CUDA",
    )
    parser.add_argument(
        "--precision",
        default=None,
        choices=["auto", *PRECISIONS],
        help="default: the suite's rule (fp16 on CUDA unless the strategy is fp32 officially, fp32 on CPU)",
    )
    parser.add_argument("--epochs", type=int, default=2, help="epochs a task (default 2)")
    parser.add_argument("--tasks", type=int, default=2, help="tasks of the stream, all learned (default 2)")
    parser.add_argument("--train-per-class", type=int, help="default 50 on the CPU, 500 on CUDA")
    parser.add_argument("--test-per-class", type=int, help="default 10 on the CPU, 100 on CUDA")
    parser.add_argument("--batch-size", type=int, help="one training batch size (default: each recipe's)")
    parser.add_argument(
        "--num-workers", type=int, help="loader workers (default: 0 on the CPU, the suite's on CUDA: 8)"
    )
    parser.add_argument("--threads", default="auto", help="torch's threads (default auto: the runner's)")
    parser.add_argument(
        "--reference-steps", type=int, default=Options.reference_steps, help="timed reference steps"
    )
    parser.add_argument("--data-root", help="where to write the fake data (default: a temporary folder)")
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the work, not after it
    device_type = torch.device(args.device).type
    train_default, test_default = PER_CLASS["cuda" if device_type == "cuda" else "cpu"]
    args.train_per_class = args.train_per_class or train_default
    args.test_per_class = args.test_per_class or test_default
    args.model = args.model or (CUDA_MODEL if device_type == "cuda" else TINY_MODEL)
    if args.num_workers is None:
        args.num_workers = load_suite(SUITE)["defaults"]["num_workers"] if device_type == "cuda" else 0
    counts = {f"--{name.replace('_', '-')}": getattr(args, name) for name in _COUNTS}
    if args.batch_size is not None:
        counts["--batch-size"] = args.batch_size
    for flag, value in counts.items():
        if value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    if args.num_workers < 0:
        raise UserError(f"--num-workers must be at least 0, not {args.num_workers}")
    if args.dataset not in fake_targets():
        raise UserError(
            f"--dataset {args.dataset!r} has no fake data; choose one of {', '.join(fake_targets())}"
        )
    for name in args.strategies:
        get_strategy(name)  # an unknown name: one line that lists the valid ones
    threads = set_threads(check_threads(args.threads), args.device)
    with tempfile.TemporaryDirectory(prefix="pipeline-speed-") as scratch:
        root = Path(args.data_root) if args.data_root else Path(scratch) / "data"
        make_fake_data(root, (args.dataset,), args.train_per_class, args.test_per_class, weights=False)
        runs = run_specs(args)
        preflight(runs, str(root))
        options = Options(reference_steps=args.reference_steps)
        rows = []
        progress = tqdm(runs, desc="pipeline speed", unit="strategy")
        for spec in progress:
            progress.set_postfix(strategy=spec.label)
            rows.append(measure_run(spec, str(root), Path(scratch) / "results" / spec.label, options))
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": {**machine(args.device), "torch_threads": threads},
        "model": args.model,
        "settings": {
            "suite": SUITE,
            "dataset": args.dataset,
            "tasks": args.tasks,
            "epochs": args.epochs,
            "train_per_class": args.train_per_class,
            "test_per_class": args.test_per_class,
            "batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "reference_steps": args.reference_steps,
        },
        "rows": rows,
    }
    return published(results, markdown_table(results), args.out)


def main(argv: list[str] | None = None) -> dict:
    """Measure (module docstring) and return the results; a mistake in the input prints one line
    and exits with code 2."""
    return outcome_of(_command, argv)


if __name__ == "__main__":
    main()
