"""The GPU-hours a suite's runs will take, from rates measured on the GPU: what
``python -m benchmarks.run --suite main --dry-run`` prints under its table.

The rates are those of the runner itself, measured by ``python -m benchmarks.tools.gpu_check`` (its
pipeline phase, ``pipeline.json``): each strategy's training and evaluation images per second over
whole epochs and stages of ``build_run``, loaders included. A run's images are counted from its
resolved config and the dataset's size (``DatasetUnit.image_counts``, known without the files):

- training: ``epochs`` x the dataset's training images (every task trains its own classes' images
  for the recipe's epochs, so the tasks together see the training set ``epochs`` times; the tasks
  left, their share of the classes: a half-base split's first task is more than a 1/T);
- evaluation: every stage scores the whole test set (the future classes' images too: the AUROC of
  seen against future), so the stages together score it T times.

Second stages (GR4CIL's compensation, MG-CLIP's visual stage), prototype passes and a strategy that
trains fewer tasks than all (Aper-Adapter adapts at the first) are not modelled: the figure is the
cost of the main loop at the measured pace, a plan, not a bill. Only the tasks a run has left count.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.core.choices import GPU_CHECK_COMMAND
from benchmarks.core.errors import UserError
from benchmarks.data.splits import task_sizes
from benchmarks.data.unit import dataset_unit
from benchmarks.runner.run_spec import RunSpec, dataset_loader_options
from benchmarks.runner.task_splits import class_count

#: rates measured once on an H100 (card, precision, commit inside), for a dry run before any check
REFERENCE_RATES = Path(__file__).parents[1] / "assets" / "gpu_reference_rates.json"
GPU_CHECK_FOLDER = "gpu_check"  # where GPU_CHECK_COMMAND leaves its rates: runs/gpu_check/<date>/
RATES_FILE = "pipeline.json"
SPEED_FILE = "speed.json"  # the speed phase's table, beside it: scales the rates of the others


@dataclass(frozen=True)
class Rates:
    """Images per second of the runner on one GPU, by strategy (``pipeline.json``'s rows), and the
    strategies whose rates are scaled from the speed table (``scaled_rates``)."""

    path: Path
    train: dict[str, float]
    eval: dict[str, float]
    model: str | None = None  # the backbone they were measured with, where the file says
    scaled: frozenset[str] = frozenset()
    reference: str | None = None  # for the stored reference rates: the card, precision, workers, commit


@dataclass
class Estimate:
    """The sum over the runs left: seconds of training and evaluation, and the runs it leaves out."""

    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    runs: int = 0
    scaled_runs: int = 0  # of ``runs``, those at rates scaled from the speed table
    without: dict[str, list[str]] = field(default_factory=dict)  # why no estimate -> "strategy / dataset"


def find_rates(given: str | None, results_dir: Path) -> Path | None:
    """``--rates FILE`` (refused in one line when it is not a file), else the newest
    ``gpu_check/*/pipeline.json`` beside the results folder (``runs/main`` -> ``runs/gpu_check``) or
    under ``./runs``; None where no check has been run."""
    if given is not None:
        if not Path(given).is_file():
            raise UserError(
                f"--rates {given} is not a file; give a {RATES_FILE} written by {GPU_CHECK_COMMAND}"
            )
        return Path(given)
    folders = dict.fromkeys([results_dir.parent / GPU_CHECK_FOLDER, Path("runs") / GPU_CHECK_FOLDER])
    found = [path for folder in folders for path in folder.glob(f"*/{RATES_FILE}") if path.is_file()]
    return max(found, key=lambda path: path.stat().st_mtime) if found else None


def read_rates(path: Path) -> Rates:
    """The rates in ``path``: a JSON list of rows, or an object holding them under ``rows``; a row
    without a positive rate gives none for its strategy. A file that is not such JSON is one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(
            f"cannot read the GPU rates {path}: {err}; rerun {GPU_CHECK_COMMAND} or give --rates"
        ) from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{path} holds no rows of rates; rerun {GPU_CHECK_COMMAND} or give another --rates")

    def positive(row: dict, key: str) -> bool:
        value = row.get(key)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    train = {
        row["strategy"]: float(row["train_images_per_second"])
        for row in rows
        if positive(row, "train_images_per_second")
    }
    evaluation = {
        row["strategy"]: float(row["eval_images_per_second"])
        for row in rows
        if positive(row, "eval_images_per_second")
    }
    model = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else None
    return scaled_rates(Rates(path, train, evaluation, model), path.parent / SPEED_FILE)


def reference_rates() -> Rates:
    """The stored reference rates (``REFERENCE_RATES``), named by card, precision, workers and commit."""
    rates = read_rates(REFERENCE_RATES)
    data = json.loads(REFERENCE_RATES.read_text(encoding="utf-8"))
    where = (
        f"the reference rates of an {data['card']} ({data['precision']}, {data['num_workers']} loader "
        f"workers, commit {data['commit']}; {REFERENCE_RATES.name}), not of your card"
    )
    return dataclasses.replace(rates, reference=where)


def scaled_rates(rates: Rates, speed_file: Path) -> Rates:
    """``rates`` completed from the speed phase's table (``speed.json`` of the same check): a strategy
    the runner was not measured with gets a measured strategy's runner rates times the two
    strategies' ratio in that table (its training steps, its evaluation). The runner's costs around
    the step (loaders, epochs, stages) are taken to scale alike; the line counts such runs apart."""
    try:
        rows = json.loads(speed_file.read_text(encoding="utf-8")).get("rows", [])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return rates
    table: dict[str, dict[str, float]] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("strategy"), str):
            table[row["strategy"]] = {
                key: float(row[key])
                for key in ("train_images_per_second", "eval_images_per_second")
                if isinstance(row.get(key), (int, float)) and row[key] > 0
            }
    known = [s for s in rates.train if s in rates.eval and len(table.get(s, {})) == 2]
    if not known:
        return rates
    base, step = known[0], table[known[0]]
    train, evaluation, scaled = dict(rates.train), dict(rates.eval), set()
    for strategy, speeds in table.items():
        if strategy not in train and len(speeds) == 2:
            train[strategy] = (
                rates.train[base] * speeds["train_images_per_second"] / step["train_images_per_second"]
            )
            evaluation[strategy] = (
                rates.eval[base] * speeds["eval_images_per_second"] / step["eval_images_per_second"]
            )
            scaled.add(strategy)
    return Rates(rates.path, train, evaluation, rates.model, frozenset(scaled))


def run_images(spec: RunSpec, config: dict, tasks_done: int) -> tuple[float, float] | str:
    """(training, evaluation) images of the tasks ``spec`` has left after ``tasks_done``, or why
    they are not known (words that the runs' names follow)."""
    counts = dataset_unit(spec.dataset).image_counts(**dataset_loader_options(spec.dataset_options))
    if counts is None:
        return "a dataset size not known in advance for"
    epochs = config["strategy_config"].get("epochs", 0)
    if not isinstance(epochs, int) or isinstance(epochs, bool):
        return "epochs set at run time for"
    train, test = counts
    tasks = spec.n_tasks
    # the tasks left train their own classes' images: a half-base split's first task holds more
    n_classes = class_count(spec.dataset, spec.dataset_options) if spec.split else None
    sizes = task_sizes(spec.tasks, n_classes) if n_classes else [1] * tasks
    train_images = epochs * train * sum(sizes[tasks_done:]) / sum(sizes)
    eval_images = test * (tasks - tasks_done)  # every stage scores every test image
    return train_images, eval_images


def estimate(pending: list[tuple[RunSpec, dict, int]], rates: Rates) -> Estimate:
    """The GPU time of ``pending`` (spec, resolved config, tasks done) at ``rates``."""
    total = Estimate()
    for spec, config, done in pending:
        model = spec.backbone.get("model")
        # the run's training and scored images, or why no time can be given for it
        images: tuple[float, float] | str
        if rates.model is not None and model != rates.model:
            images = f"rates measured with {rates.model}, not {model}"
        elif spec.strategy not in rates.train or spec.strategy not in rates.eval:
            images = "no rate measured for"
        else:
            images = run_images(spec, config, done)
        if isinstance(images, str):
            why = images
            where = spec.strategy if why == "no rate measured for" else f"{spec.strategy} / {spec.dataset}"
            total.without.setdefault(why, [])
            if where not in total.without[why]:
                total.without[why].append(where)
            continue
        train_images, eval_images = images
        total.train_seconds += train_images / rates.train[spec.strategy]
        total.eval_seconds += eval_images / rates.eval[spec.strategy]
        total.runs += 1
        total.scaled_runs += spec.strategy in rates.scaled
    return total


def gpu_hours_line(pending: list[tuple[RunSpec, dict, int]], rates: Rates | None) -> str:
    """One line under the dry-run table: the GPU-hours the runs left take at the measured rates,
    or, with no rates, how to measure them."""
    if rates is None:
        return (
            f"no GPU rates measured: run {GPU_CHECK_COMMAND} on the GPU (it writes "
            f"runs/{GPU_CHECK_FOLDER}/DATE/{RATES_FILE}), or give --rates FILE, to see the GPU-hours expected"
        )
    total = estimate(pending, rates)
    hours = (total.train_seconds + total.eval_seconds) / 3600
    line = (
        f"GPU-hours expected at {rates.reference or f'the rates of {rates.path}'}: {hours:,.1f} "
        f"(training {total.train_seconds / 3600:,.1f}, evaluation {total.eval_seconds / 3600:,.1f}) "
        f"for {total.runs} of {len(pending)} run(s) left, one GPU a run, second stages not counted"
    )
    if total.scaled_runs:
        line += f" ({total.scaled_runs} at runner rates scaled from the speed table's)"
    if total.without:
        reasons = "; ".join(f"{why} {', '.join(sorted(where))}" for why, where in total.without.items())
        line += f"; {len(pending) - total.runs} run(s) without an estimate ({reasons})"
    if rates.reference:
        line += f"; for your card's own: {GPU_CHECK_COMMAND}"
    return line
