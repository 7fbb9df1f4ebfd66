"""Steady-state training and evaluation images per second of every strategy, against a physical reference.

``python -m benchmarks.tools.speed --train [--strategies a,b] [--device cpu] [--model tiny-clip-32]``
builds each strategy as the runner does for the ``smoke-baselines`` suite (its own resolved config:
batch size, learning rate, augmentation, LoRA rank, ...) on task 1 of the synthetic stream, with
``--train-per-class`` training images a class so that an epoch has more steps, its pixels augmented
where the runner augments them (``--augment-on``), and measures in one run:

1. ``train``: images/s of ``strategy.train`` through the real loader, over training steps
   ``warmup + 1 .. warmup + steps`` (an Avalanche plugin stamps the end of each step; the epoch
   count is raised so that the task has that many steps, and training stops after the last);
2. ``own step``: the same strategy's training path, on a fresh copy of it, whose train loader
   yields one batch again and again: a batch of the real loader, collated and already on the
   device. ``train / own step`` is what the loader costs;
3. the **reference** (``benchmarks.tools.reference``: plain open_clip and torch, no code of this
   suite), in the same process, on the same device, precision and batch: ``step``, a training step
   with the strategy's trainable set built plainly (``reference_pairing.trainable_set``: LoRA of its
   rank on k/v of the towers it trains, bottleneck adapters beside the MLPs, the whole visual tower,
   or a forward alone where nothing it trains lies in the backbone), ``full step`` (full fine-tuning
   of the visual tower), ``frozen backward`` (a backward through every block with no weight
   gradient), and ``forward`` (``encode_image`` without grad, at the eval batch size). The word
   "ceiling" means this reference, never the suite's own step;
4. ``eval``: images/s of ``evaluate_dataset`` over the test images of the seen classes after the
   task (the runner's path: a fresh cache key each time, as at stage 1), against the reference's
   forward over the same images as on-device batches of the eval batch size. The two alternate, in
   rotated order, and each reports its median time;
5. ``aten ops``: the aten operators one training step's forward and backward dispatches (the
   strategy's ``compute_logits``, ``compute_loss`` and ``backward`` on the timed batch, after a
   warm-up step), against the reference step's with the same trainable set on the same batch: a
   host-side count, the same on every device, and what a GPU pays one launch each for.

Every ratio is to the reference: ``train / ref step``, ``own step / ref step``, ``train / full
step``, ``eval / forward``, ``aten ops / ref``. Work a strategy does outside Avalanche's step loop
(``setup_task``, ``finish_task``: second stages, prototypes, merging) is not timed; its seconds are
reported. ``--steps-for NAME=N`` times fewer steps of a slow strategy. ``--threads`` sets torch's
intra-op threads; the report gives them with the CPU count and the 1-minute load average at the
start, as other processes on the same cores slow every number down (with torch's default of one
thread a core, many times over: a thread that waits for a descheduled partner stalls the step).
Results print as a Markdown table and go to ``--out`` as JSON. A mistake in the input (an unknown
strategy, a step count below 1) prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import statistics
import time
from collections.abc import Callable

import torch
from avalanche.core import SupervisedPlugin
from tqdm.auto import tqdm

from benchmarks.backbone import TINY_MODEL
from benchmarks.core.environment import seed_everything
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.core.precision import PRECISIONS
from benchmarks.data.device_augment import AUGMENT_ON, AugmentOn
from benchmarks.runner.building import ResolvedRun, build_run, resolve
from benchmarks.runner.execute import preflight
from benchmarks.runner.run_spec import RunSpec
from benchmarks.runner.suites import expand, load_suite
from benchmarks.tools import reference
from benchmarks.tools.measuring import interleaved, own_strategy
from benchmarks.tools.reference_pairing import StepProbe, probe_step, reference_model, reference_steps
from benchmarks.tools.speed_report import machine, outcome_of, published, table_number
from strategies.base import CLIPStrategy
from strategies.registry import available, get_strategy

SUITE = "smoke-baselines"
DATA_ROOT = "data"  # the synthetic world is generated, never read from disk


def _wait_for(device: torch.device) -> None:
    """GPU kernels run asynchronously: a timestamp on CUDA waits for them to end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(SupervisedPlugin):
    """Times training steps ``warmup + 1 .. warmup + steps`` of one task, then stops the training.

    It stamps the end of step ``warmup`` and of step ``warmup + steps`` (``after_training_iteration``)
    and counts the steps and images in between. It keeps the first of the largest batches it sees
    (as the step saw it: on the device), and the seconds before the first step (loader,
    ``setup_task``) and after the last (``finish_task``). ``at_end(strategy)`` runs right after the
    last timed step, with the strategy as it trains."""

    def __init__(self, warmup: int, steps: int, at_end: Callable[[CLIPStrategy], None] | None = None):
        super().__init__()
        self.warmup, self.steps, self.at_end = warmup, steps, at_end
        self.iterations = 0  # training steps taken
        self.steps_on_one_batch = 0  # steps that trained on the very ``one_batch`` of the strategy
        self.timed_steps = 0  # steps between the two stamps
        self.timed_images = 0
        self.seconds: float | None = None  # between the two stamps
        self.batch: list[torch.Tensor] | None = None  # the first largest batch, as the step saw it
        self.in_step = False  # inside a training step (a loader made now serves the step itself)
        self.setup_seconds = self.finish_seconds = 0.0
        self._start = self._begin = self._last = 0.0

    def before_training(self, strategy, **kwargs) -> None:
        self._begin = time.perf_counter()

    def before_training_iteration(self, strategy, **kwargs) -> None:
        if self.iterations == 0:
            self.setup_seconds = time.perf_counter() - self._begin
        self.in_step = True

    def after_training_iteration(self, strategy, **kwargs) -> None:
        self.in_step = False
        self.iterations += 1
        self.steps_on_one_batch += strategy.mbatch is getattr(strategy, "one_batch", None)
        if self.batch is None or len(strategy.mb_x) > len(self.batch[0]):
            self.batch = strategy.mbatch
        if self.iterations == self.warmup:
            _wait_for(strategy.device)
            self._start = time.perf_counter()
        elif self.warmup < self.iterations <= self.warmup + self.steps:
            self.timed_steps += 1
            self.timed_images += len(strategy.mb_x)
            if self.iterations == self.warmup + self.steps:
                _wait_for(strategy.device)
                self.seconds = time.perf_counter() - self._start
                if self.at_end is not None:
                    self.at_end(strategy)
                strategy.stop_training()  # the rest of the epochs would only repeat these steps
        self._last = time.perf_counter()

    def after_training_exp(self, strategy, **kwargs) -> None:
        if self.iterations:
            self.finish_seconds = time.perf_counter() - self._last

    @property
    def images_per_second(self) -> float | None:
        return self.timed_images / self.seconds if self.seconds else None


class RepeatedBatch:
    """A train loader of ``length`` batches a pass that are all one batch: collated, on the device."""

    def __init__(self, batch: list[torch.Tensor], length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return itertools.repeat(self.batch, self.length)


class OnOneBatch(CLIPStrategy):
    """Put before a strategy class by ``on_one_batch``: its train loader is a ``RepeatedBatch`` of
    its ``one_batch`` (set before training), as long as the real loader; it records the purposes of
    the loaders it makes for its own use during a step (such a loader still loads real images), and
    skips ``finish_task``."""

    one_batch: list[torch.Tensor]
    timer: StepTimer | None = None
    loaders_in_steps: tuple[str, ...] = ()

    def make_train_dataloader(self, *args, **kwargs):
        super().make_train_dataloader(*args, **kwargs)  # for its length alone
        self.dataloader = RepeatedBatch(self.one_batch, len(self.dataloader))

    def data_loader(self, dataset, batch_size=None, shuffle=False, passes=1, purpose="eval", **kwargs):
        if self.timer is not None and self.timer.in_step:
            self.loaders_in_steps = (*self.loaders_in_steps, purpose)
        return super().data_loader(dataset, batch_size, shuffle, passes, purpose, **kwargs)

    def finish_task(self, task: int, classes: list[int]) -> None:
        """Nothing: this copy is dropped after its steps, so its second stages would only cost time."""


def on_one_batch(strategy_cls: type[CLIPStrategy]) -> type[OnOneBatch]:
    """``strategy_cls`` trained on one batch: ``OnOneBatch`` first in its order, so that its three
    methods run the strategy's own through ``super()``."""
    name = f"{strategy_cls.__name__}OnOneBatch"
    return type(
        name, (OnOneBatch, strategy_cls), {"__qualname__": name, "__module__": strategy_cls.__module__}
    )


def evaluation_speed(strategy: CLIPStrategy, stream, repeats: int, model: torch.nn.Module) -> dict:
    """Images/s of ``evaluate_dataset`` over the test images of the seen classes (a fresh cache key
    each time: the runner's first evaluation of them) and of the reference's forward (``model``,
    bare open_clip) over them, as on-device batches of the eval batch size."""
    seen = set(strategy.seen_classes)
    test = stream.test_set.subset([i for i, t in enumerate(stream.test_targets) if t in seen])
    device = strategy.device
    batches = [images.to(device) for images, *_ in strategy.data_loader(test)]
    keys = itertools.count()
    forward = reference.forward_pass(model, strategy.settings.precision)

    def forwards() -> None:
        for images in batches:
            forward(images)

    times = interleaved(
        {
            "eval": lambda: strategy.evaluate_dataset(test, cache_key=f"train-speed-{next(keys)}"),
            "forward": forwards,
        },
        repeats,
        wait=lambda: _wait_for(device),
    )
    seconds = {name: statistics.median(values) for name, values in times.items()}
    n = len(test)
    return {
        "eval_images": n,
        "eval_images_per_second": n / seconds["eval"],
        "forward_images_per_second": n / seconds["forward"],
    }


@dataclasses.dataclass
class Options:
    warmup: int = 20
    steps: int = 200
    eval_repeats: int = 5
    steps_for: dict[str, int] = dataclasses.field(default_factory=dict)  # fewer for a slow strategy


def _train(spec: RunSpec, resolved: ResolvedRun, timer: StepTimer, one_batch=None):
    """A fresh strategy and stream as the runner builds them (``resolved.strategy_cls`` trains on one
    batch when ``one_batch`` is given), trained on task 1 under ``timer``. Returns the strategy, the
    stream and a note if the training diverged."""
    built = build_run(resolved, DATA_ROOT, plugins=[timer])
    stream, strategy = built.stream, own_strategy(built.strategy)
    if one_batch is not None:
        assert isinstance(strategy, OnOneBatch)  # resolved.strategy_cls is on_one_batch's
        strategy.one_batch, strategy.timer = one_batch, timer
    seed_everything(spec.seed, 0)
    try:
        strategy.learn(stream.train_stream[0])
    except FloatingPointError as err:  # more steps than the recipe's: report it, keep the timings
        return strategy, stream, f"diverged: {err}"
    return strategy, stream, None


def measure_strategy(spec: RunSpec, options: Options) -> dict:
    """The speeds of one strategy and of its reference (module docstring), their ratios and notes."""
    resolved = resolve(spec, DATA_ROOT)
    strategy_cfg = resolved.strategy_cfg
    warmup, steps = options.warmup, options.steps_for.get(spec.label, options.steps)
    if isinstance(strategy_cfg.epochs, int) and strategy_cfg.epochs > 0:
        # every epoch has at least one step; the timer stops the training after the last timed one
        strategy_cfg = dataclasses.replace(strategy_cfg, epochs=warmup + steps)
        resolved = dataclasses.replace(resolved, strategy_cfg=strategy_cfg)
    notes: list[str] = []
    real = StepTimer(warmup, steps)
    strategy, stream, diverged = _train(spec, resolved, real)
    row = {
        "strategy": spec.label,
        "precision": strategy.settings.precision,
        "batch_size": strategy.train_mb_size,
        "eval_batch_size": strategy.eval_mb_size,
        "steps_requested": steps,
        "steps_taken": real.iterations,
        "steps_timed": {"train": real.timed_steps, "own_step": 0, "reference_step": 0},
        "train_images_per_second": real.images_per_second,
        "own_step_images_per_second": None,
        "eval_images_per_second": None,
        "reference": {
            "forward_images_per_second": None,
            "step_images_per_second": None,
            "step_kind": None,
            "full_step_images_per_second": None,
            "frozen_backward_images_per_second": None,
        },
        "aten_ops": None,
        "setup_seconds": real.setup_seconds,
        "finish_seconds": real.finish_seconds,
    }
    if real.iterations == 0:
        notes.append("trains nothing")
    elif real.seconds is None:
        notes.append(f"training ended after {real.iterations} steps, before the timed ones")
    if diverged:
        notes.append(diverged)
    if type(strategy).finish_task is not CLIPStrategy.finish_task and real.iterations:
        notes.append(f"finish_task (after the steps) {real.finish_seconds:.1f} s, not timed")
    model = reference_model(spec)
    if real.seconds is not None and real.batch is not None:
        notes += _own_step_and_reference(spec, resolved, warmup, steps, real.batch, model, row)
    if diverged is None:
        measured = evaluation_speed(strategy, stream, options.eval_repeats, model)
        row["eval_images"] = measured["eval_images"]
        row["eval_images_per_second"] = measured["eval_images_per_second"]
        row["reference"]["forward_images_per_second"] = measured["forward_images_per_second"]
    row["notes"] = notes
    return _with_ratios(row)


def _own_step_and_reference(
    spec: RunSpec, resolved: ResolvedRun, warmup: int, steps: int, batch, model, row: dict
) -> list[str]:
    """Measure the strategy's own step on a fresh copy of it that trains on ``batch`` alone (probing
    its trainable set and counting its ops after the last timed step), then the reference's steps
    and ops on ``batch``; enter them in ``row``. Returns their notes."""
    probe = StepProbe()
    timer = StepTimer(warmup, steps, at_end=probe_step(probe, batch))
    one_batch_run = dataclasses.replace(resolved, strategy_cls=on_one_batch(resolved.strategy_cls))
    copy, _, _ = _train(spec, one_batch_run, timer, batch)
    row["own_step_images_per_second"] = timer.images_per_second
    row["steps_timed"]["own_step"] = timer.timed_steps
    row["own_step_steps_on_one_batch"] = timer.steps_on_one_batch
    notes = []
    if copy.loaders_in_steps:
        notes.append(
            f"its steps also load from a loader of their own ({', '.join(copy.loaders_in_steps)}), "
            "in the own step too"
        )
    del copy
    if probe.targets is None:  # training ended before the last timed step
        return notes
    measured, reference_ops = reference_steps(model, spec, probe, batch, row["precision"], warmup, steps)
    row["reference"].update(measured)
    row["steps_timed"]["reference_step"] = steps
    row["reference_trainable"] = dataclasses.asdict(probe.trainable)
    if probe.ops is not None:
        ratio = probe.ops / reference_ops
        row["aten_ops"] = {"strategy": probe.ops, "reference": reference_ops, "ratio": ratio}
    else:
        notes.append(f"aten ops not counted: {probe.ops_error}")
    if probe.trainable.kind == "forward":
        notes.append("reference step is a forward alone: nothing it trains is in the backbone's forward")
    return notes


def _with_ratios(row: dict) -> dict:
    """The row's ratios, each the quotient of the two images/s it names (None where one is missing):
    every one is to the reference."""
    ref = row["reference"]

    def ratio(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    train, own = row["train_images_per_second"], row["own_step_images_per_second"]
    row["train_over_reference_step"] = ratio(train, ref["step_images_per_second"])
    row["own_step_over_reference_step"] = ratio(own, ref["step_images_per_second"])
    row["train_over_full_step"] = ratio(train, ref["full_step_images_per_second"])
    row["train_over_own_step"] = ratio(train, own)  # what the loader costs
    row["eval_over_forward"] = ratio(row["eval_images_per_second"], ref["forward_images_per_second"])
    return row


def run_specs(
    names: list[str],
    model: str,
    device: str,
    precision: str,
    train_per_class: int,
    augment_on: AugmentOn | None = None,
    batch_size: int | None = None,
) -> list[RunSpec]:
    """One run of the suite per strategy (seed 0), on ``model`` (the tiny model with its shipped
    synthetic weights, any other randomly initialised) with ``train_per_class`` training images a
    class; ``augment_on``: where the pixels are augmented (None: the suite's, as the runner's);
    ``batch_size``: one training batch size for every strategy (None: each recipe's own)."""
    suite = load_suite(SUITE)
    suite["backbone"] = {"model": model, "pretrained": "synthetic" if model == TINY_MODEL else "none"}
    suite["dataset"]["synthetic"] = {**suite["dataset"]["synthetic"], "n_train_per_class": train_per_class}
    if batch_size is not None:
        tables = suite.setdefault("strategy", {})
        for name in names:
            tables[name] = {**tables.get(name, {}), "batch_size": batch_size}
    return expand(
        suite, strategies=names, seeds=[0], device=device, precision=precision, augment_on=augment_on
    )


def markdown_table(results: dict) -> str:
    """The rows as a Markdown table, under a line that says when, where and on what they were measured."""
    host = results["machine"]
    lines = [
        f"{results['date']}: {host['cpu_count']} CPU cores ({host['torch_threads']} torch threads), "
        f"{host['device']} ({host['device_name']}), {results['model']}, {'/'.join(results['precisions'])}, "
        f"augmentation on {results['augment_on']}, suite {results['suite']}, {results['warmup']} warm-up "
        f"steps, load average {host['load_average']:.1f}; ref = bare open_clip (benchmarks.tools.reference)",
        "",
        "| strategy | precision | batch | steps timed | train img/s | own step | ref step (kind) "
        "| ref full step | ref frozen backward | train / ref step | own step / ref step | train / full step "
        "| eval img/s | ref forward | eval / forward | aten ops / ref | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        ref, ops = row["reference"], row["aten_ops"]
        kind = f" ({ref['step_kind']})" if ref["step_kind"] else ""
        cells = [
            row["strategy"],
            row["precision"],
            str(row["batch_size"]),
            str(row["steps_timed"]["train"]),
            table_number(row["train_images_per_second"]),
            table_number(row["own_step_images_per_second"]),
            table_number(ref["step_images_per_second"]) + kind,
            table_number(ref["full_step_images_per_second"]),
            table_number(ref["frozen_backward_images_per_second"]),
            table_number(row["train_over_reference_step"], ratio=True),
            table_number(row["own_step_over_reference_step"], ratio=True),
            table_number(row["train_over_full_step"], ratio=True),
            table_number(row["eval_images_per_second"]),
            table_number(ref["forward_images_per_second"]),
            table_number(row["eval_over_forward"], ratio=True),
            f"{ops['strategy']:,} / {ops['reference']:,} = {ops['ratio']:.2f}" if ops else "-",
            "; ".join(row["notes"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_COUNTS = ("warmup", "steps", "train_per_class", "eval_repeats")  # options that must be at least 1


def _steps_for(text: str) -> dict[str, int]:
    """``--steps-for l2p_pp=50,magmax=80`` -> ``{"l2p_pp": 50, "magmax": 80}``."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, steps = item.partition("=")
        if not steps.strip().isdigit():
            raise argparse.ArgumentTypeError(f"give NAME=STEPS, e.g. l2p_pp=50, not {item!r}")
        out[name.strip()] = int(steps)
    return out


@one_line_user_errors
def _command(argv: list[str] | None) -> dict:
    parser = CommandParser(
        prog="python -m benchmarks.tools.speed --train", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--strategies",
        type=lambda text: [name for name in text.split(",") if name],
        help="comma-separated strategies (default: every registered one)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model",
        default=TINY_MODEL,
        help=f"default {TINY_MODEL} (its synthetic weights); ViT-B-16-quickgelu: a random ViT-B/16, for CUDA",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", *PRECISIONS],
        help="default: the suite's rule (fp16 on CUDA unless the strategy is fp32 officially, fp32 on CPU)",
    )
    parser.add_argument(
        "--augment-on",
        choices=AUGMENT_ON,
        help="where pixels are augmented, as benchmarks.run's flag (default: the runner's, device)",
    )
    parser.add_argument(
        "--batch-size", type=int, help="one training batch size for every strategy (default: each recipe's)"
    )
    parser.add_argument("--warmup", type=int, default=Options.warmup, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=Options.steps, help="timed steps")
    parser.add_argument(
        "--steps-for",
        type=_steps_for,
        default={},
        metavar="NAME=N,...",
        help="fewer timed steps for the strategies named (slow ones); the rest take --steps",
    )
    parser.add_argument(
        "--threads", type=int, help="torch's intra-op threads (default: torch's own, one a core)"
    )
    parser.add_argument(
        "--train-per-class", type=int, default=100, help="training images a class (the suite: 50)"
    )
    parser.add_argument("--eval-repeats", type=int, default=Options.eval_repeats, help="timed evaluations")
    parser.add_argument("--out", help="write the measurements as JSON here")
    args = parser.parse_args(argv)
    parser.output_file(args.out)  # before the work, not after it
    counts = {f"--{name.replace('_', '-')}": getattr(args, name) for name in _COUNTS}
    counts.update({f"--steps-for {name}": steps for name, steps in args.steps_for.items()})
    if args.threads is not None:
        counts["--threads"] = args.threads
    if args.batch_size is not None:
        counts["--batch-size"] = args.batch_size
    for flag, value in counts.items():
        if value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    names = args.strategies or available()
    for name in [*names, *args.steps_for]:
        get_strategy(name)  # an unknown name: one line that lists the valid ones
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    runs = run_specs(
        names, args.model, args.device, args.precision, args.train_per_class, args.augment_on, args.batch_size
    )
    preflight(runs, DATA_ROOT)
    options = Options(args.warmup, args.steps, args.eval_repeats, args.steps_for)
    rows = []
    progress = tqdm(runs, desc="train speed", unit="strategy")
    for spec in progress:
        progress.set_postfix(strategy=spec.label)
        rows.append(measure_strategy(spec, options))
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(runs[0].device),
        "model": args.model,
        "precisions": sorted({row["precision"] for row in rows}),
        "augment_on": runs[0].augment_on,
        "suite": SUITE,
        "warmup": args.warmup,
        "steps": args.steps,
        "steps_for": args.steps_for,
        "train_per_class": args.train_per_class,
        "batch_size": args.batch_size,
        "eval_repeats": args.eval_repeats,
        "rows": rows,
    }
    return published(results, markdown_table(results), args.out)


def main(argv: list[str] | None = None) -> dict:
    """Measure (module docstring) and return the results; a mistake in the input prints one line
    and exits with code 2."""
    return outcome_of(_command, argv)


if __name__ == "__main__":
    main()
