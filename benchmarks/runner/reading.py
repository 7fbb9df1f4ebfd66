"""Reading the results store: every finished result under one or more folders, as typed records.

``iter_results`` (the store's own walk, ``benchmarks.runner.results``) yields each result file's
JSON as stored (the runner's own checks read it so); ``read_results`` is what every reader of
results uses: each file as a ``RunResult`` (``ResultFile``), gathered in ``Results``, which holds
the one rule that picks a run's result where several files share its key. A file that is no
result this suite reads (another schema version, a digest that disagrees, no complete result) is
left out with a line in ``Results.skipped``; a result of an older readable version comes with its
summary completed (``with_complete_summary``).
"""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from benchmarks.backbone.weights import SYNTHETIC_CHECKPOINTS
from benchmarks.core.errors import UserError
from benchmarks.data.protocols import DEFAULT_PROTOCOL
from benchmarks.runner.result_record import RunResult, changed_entries
from benchmarks.runner.results import Predictions, RunKey, iter_results


@dataclass(frozen=True)
class ResultFile:
    """One result file: where it lies, and what it holds."""

    path: Path
    result: RunResult

    @property
    def key(self) -> RunKey:
        return self.result.key

    def load_predictions(self, problems: list[str] | None = None) -> Predictions | None:
        """The predictions sidecar, checked against the digest the result holds; or None.

        None without a word for a version-1 result (it has none). For a missing or damaged sidecar,
        a one-line reason goes to ``problems`` where given, else a warning: the result's means stay
        usable, only the per-image analyses lose that run.
        """
        from safetensors.numpy import load

        entry = self.result.predictions
        if not entry:
            return None
        path = self.path.parent / entry["file"]

        def problem(why: str) -> Predictions | None:
            """Say ``why`` (to ``problems``, else as a warning); no predictions, then."""
            line = (
                f"{path}: {why}; the run's means are used, its per-image analyses are not "
                "(rerun it with --force)"
            )
            problems.append(line) if problems is not None else warnings.warn(line, stacklevel=3)
            return None

        try:
            blob = path.read_bytes()
        except OSError:
            return problem("predictions sidecar missing")
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            return problem("predictions sidecar damaged (its SHA-256 differs from the one in the result)")
        try:
            tensors = load(blob)
            found = Predictions(
                tensors["predictions"].astype(np.int64),
                tensors["targets"].astype(np.int64),
                tensors["image_ids"].astype(np.int64),
            )
        except Exception as err:  # safetensors raises its own error types
            return problem(f"predictions sidecar unreadable ({type(err).__name__})")
        expected = (len(self.result.stages), entry["n_images"])
        if found.predictions.shape != expected or found.targets.shape != expected[1:]:
            return problem(f"predictions sidecar has shape {found.predictions.shape}, expected {expected}")
        return found


@dataclass(frozen=True)
class Results:
    """Every readable result under one or more folders, and the one rule that picks a run's result
    where several files share its key (a zero-shot run beside a main one, say): the result without
    ``zero_shot`` first. Identical copies (same key and config) count once; results the rule cannot
    tell apart are ``ambiguous``, which ``read_results`` refuses."""

    found: tuple[ResultFile, ...]  # every readable result, by path
    skipped: tuple[str, ...] = ()  # one line per file left out, naming it and why

    def where(self, keep: Callable[[ResultFile], bool]) -> Results:
        """The results for which ``keep(file)`` holds, the rule applied to them alone."""
        return Results(tuple(file for file in self.found if keep(file)), self.skipped)

    @cached_property  # a frozen dataclass still caches: the value goes to the instance's __dict__
    def distinct(self) -> list[ResultFile]:
        """Every distinct run: one file per (key, config hash), the first by path."""
        seen, out = set(), []
        for file in self.found:
            ident = (file.key, file.result.config_hash)
            if ident not in seen:
                seen.add(ident)
                out.append(file)
        return out

    @cached_property
    def _groups(self) -> dict[RunKey, list[ResultFile]]:
        groups: dict[RunKey, list[ResultFile]] = {}
        for file in sorted(self.distinct, key=lambda f: (f.result.zero_shot is not None, f.path)):
            groups.setdefault(file.key, []).append(file)
        return groups

    @property
    def runs(self) -> list[ResultFile]:
        """One result per run key, chosen by the rule."""
        return [group[0] for group in self._groups.values()]

    @property
    def ambiguous(self) -> list[list[ResultFile]]:
        """The run keys whose results of different configs the rule cannot choose between (both
        with zero-shot targets, or both without): only their paths would decide. Two suites'
        results under one folder, or a run recomputed under another config beside the old one."""
        return [
            group
            for group in self._groups.values()
            if len(group) > 1 and (group[0].result.zero_shot is None) == (group[1].result.zero_shot is None)
        ]

    @property
    def duplicate_notes(self) -> list[str]:
        """One line per run key that results of several configs share, naming the file used."""
        return [
            f"{len(group)} results for {group[0].key} with different configs; "
            f"{group[0].path} is used (a result without zero-shot targets first)"
            for group in self._groups.values()
            if len(group) > 1
        ]

    @property
    def notes(self) -> list[str]:
        """What a reader should be told: the files skipped, then the keys several results share."""
        return [*self.skipped, *self.duplicate_notes]

    def __len__(self) -> int:
        return len(self.found)


def read_results(source: str | Path | Sequence[str | Path] | Results) -> Results:
    """Every finished result under ``source`` (a folder, or several), read once; ``.runs`` holds one
    per run key (``Results``' rule), ``.notes`` what a reader should be told. A file that
    ``RunResult`` does not read (a key missing, in one made by hand) is among those ``iter_results``
    leaves out with a line in ``skipped``. ``Results`` are returned as they are."""
    if isinstance(source, Results):
        return source
    folders = [source] if isinstance(source, (str, Path)) else list(source)
    skipped: list[str] = []
    found = [
        ResultFile(path, RunResult.from_json(data))  # iter_results checked that it reads whole
        for folder in folders
        for path, data in iter_results(folder, skipped)
    ]
    left_out: list[str] = []
    fast = [file for file in found if file.result.config.get("fast_dev_run")]
    if fast and len(fast) < len(found):  # a fast dev run checks code paths: never a real run's number
        found = [file for file in found if not file.result.config.get("fast_dev_run")]
        left_out.append(
            f"left out {len(fast)} fast-dev-run result(s) (the first: {fast[0].path}): a fast dev run "
            "checks the code paths and never enters the tables of real runs; read its folder alone"
        )
    results = Results(tuple(found), (*skipped, *left_out))
    if results.ambiguous:
        first, second, *_ = results.ambiguous[0]
        changed = ", ".join(changed_entries(first.result.config, second.result.config)) or "its config"
        where = ", ".join(map(str, folders))
        raise UserError(
            f"{len(results.ambiguous)} run(s) have results of different configs under {where}, e.g. "
            f"{first.key}: {first.path} and {second.path} (they differ in {changed}); results of two "
            "suites are never mixed: read one suite's folder (analysis.report --by-suite reads each in "
            "turn), or move one away"
        )
    return results


def result_folders(root: str | Path) -> list[Path]:
    """The folders directly under ``root`` that hold a result, by name: one per suite in the
    runner's layout (``runs/SUITE``, ``results/SUITE``); hidden folders are the runner's own."""
    return [
        folder
        for folder in sorted(Path(root).iterdir())
        if folder.is_dir() and not folder.name.startswith(".") and next(iter_results(folder, []), None)
    ]


def skipped_clause(skipped: Sequence[str]) -> str:
    """`` (skipped <file>: <why>, and N more skipped)`` for the error of a folder with no result to
    read: the file a user made by hand (``[]``, an edited summary) is named, not passed over."""
    if not skipped:
        return ""
    more = f", and {len(skipped) - 1} more skipped" if len(skipped) > 1 else ""
    return f" ({skipped[0]}{more})"


def protocol_of(result: RunResult) -> str:
    """The evaluation protocol the run was made under (``benchmarks.data.protocols``); results
    made before protocols were recorded are the default one's."""
    return result.config.get("protocol", DEFAULT_PROTOCOL)


OFFLINE_DATASET = "synthetic"  # the offline world's unit (benchmarks/data/units/synthetic.py)
#: what every output on such results says in one line (README, "What the smoke table shows")
CANNOT_RANK = (
    "it shows that each method runs the protocol end to end; it cannot rank methods, which only the "
    "real data with pretrained weights can (python -m benchmarks.run --suite main)"
)


def cannot_rank(result: RunResult) -> str | None:
    """Why a result, however measured, cannot rank methods: it was computed on the synthetic world,
    with the tiny CLIP, or with a randomly initialised backbone (the offline miniature's numbers say
    that a method runs and learns, not how it compares with another); None on real data with
    pretrained weights. Tables, the report and the comparison say so wherever they show one."""
    backbone = result.config.get("backbone") or {}
    reasons = []
    if result.dataset == OFFLINE_DATASET:
        reasons.append("the synthetic world")
    if backbone.get("model") in SYNTHETIC_CHECKPOINTS:  # a tiny CLIP, any of its twins
        reasons.append("the tiny CLIP")
    elif "pretrained" in backbone and backbone["pretrained"] is None:  # recorded as a random init
        reasons.append("a randomly initialised backbone")
    return " with ".join(reasons) or None


def counted(reasons: Iterable[str | None]) -> list[tuple[str, int]]:
    """Each reason given (``not_a_measurement``'s or ``cannot_rank``'s of some results) and how many
    results give it, in order of the reasons; None counts for nothing."""
    found = Counter(why for why in reasons if why)
    return sorted(found.items())


def ranking_caveat(reasons: Iterable[str | None]) -> str | None:
    """The one line a figure carries where some of its runs cannot rank methods (``reasons``: their
    ``cannot_rank``); None where none is given."""
    found = sorted({why for why in reasons if why})
    return f"On {' and '.join(found)}: not a ranking of methods" if found else None


def figure_caveat(results: Sequence[RunResult]) -> str | None:
    return ranking_caveat(cannot_rank(result) for result in results)


def not_a_measurement(result: RunResult) -> str | None:
    """Why a result checks the code path rather than measuring anything: a ``--fast-dev-run``, or
    fake data (``benchmarks.tools.fake_data``); None for a real result. Tables, the report and the
    comparison say so wherever they show one."""
    reasons = [
        why
        for why, flag in (("a fast dev run", "fast_dev_run"), ("fake data", "fake_data"))
        if result.config.get(flag)
    ]
    if result.config.get("evaluate_test", True) is False:  # benchmarks.tune's: no test image was read
        reasons.insert(0, "a tuning run scored on its validation split")
    return " on ".join(reasons) or None
