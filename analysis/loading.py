"""The stored results as typed records: what every reader in ``analysis`` reads.

``read_results`` reads result JSON through ``benchmarks.runner.results.load_results``, which skips
files of other schema versions and completes the summaries of versions 1 and 2
(``with_complete_summary``), and turns each file into a ``RunResult`` with its ``StageResult``
stages and ``RunCost``. A file that is no complete result (a key missing, say, in one made by hand)
is skipped with a line in ``notes``, as a file of another schema version is, or one whose summary
disagrees with its stages (its ``digest``: a summary edited by hand is never tabled). Which result stands
for a run where several files share its key stays ``LoadedResults``' rule.

A ``RunResult``'s ``config`` (the run's resolved config), ``summary``, ``diagnostics`` and
``zero_shot`` are plain dicts by design; the lookups of the config that several readers make are
the accessors below (``protocol_of``, ``measurement_caveat``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping, Sequence

from benchmarks.data.protocols import DEFAULT_PROTOCOL
from benchmarks.runner.results import (
    LoadedResults,
    RunKey,
    RunResult,
    StoredResult,
    load_results,
    not_a_measurement,
    unreadable_result,
)


@dataclass(frozen=True)
class ResultFile:
    """One result file: as the results module read it (``stored``: its path and JSON) and as a
    typed record (``result``)."""

    stored: StoredResult
    result: RunResult

    @property
    def path(self) -> Path:
        return self.stored.path

    @property
    def key(self) -> RunKey:
        return self.result.key


@dataclass(frozen=True)
class Results:
    """The results of one or more folders as typed records, under ``LoadedResults``' rule:
    ``runs`` holds one file per run key, ``distinct`` every distinct run, ``notes`` what a reader
    should be told (the files skipped, then the keys several results share)."""

    loaded: LoadedResults  # the complete results; its ``skipped`` names every file left out
    records: Mapping[Path, RunResult] = field(repr=False)  # each file of ``loaded``, by path

    def _files(self, found: Sequence[StoredResult]) -> list[ResultFile]:
        return [ResultFile(stored, self.records[stored.path]) for stored in found]

    @cached_property  # a frozen dataclass still caches: the value goes to the instance's __dict__
    def runs(self) -> list[ResultFile]:
        """One file per run key, chosen by ``LoadedResults``' rule."""
        return self._files(self.loaded.runs)

    @cached_property
    def distinct(self) -> list[ResultFile]:
        """Every distinct run: one file per (key, config hash), the first by path."""
        return self._files(self.loaded.distinct)

    def where(self, keep: Callable[[ResultFile], bool]) -> Results:
        """The results for which ``keep(file)`` holds, the rule applied to them alone."""
        return Results(
            self.loaded.where(lambda stored: keep(ResultFile(stored, self.records[stored.path]))),
            self.records,
        )

    @property
    def skipped(self) -> tuple[str, ...]:
        return self.loaded.skipped

    @property
    def duplicate_notes(self) -> list[str]:
        return self.loaded.duplicate_notes

    @property
    def notes(self) -> list[str]:
        return self.loaded.notes

    def __len__(self) -> int:
        return len(self.loaded)


def read_results(source: str | Path | Sequence[str | Path] | LoadedResults | Results) -> Results:
    """Every finished result under ``source`` (a folder, several, or what ``load_results`` read)
    as typed records; a file that ``RunResult`` does not read is left out with a line in
    ``skipped``. ``Results`` are returned as they are."""
    if isinstance(source, Results):
        return source
    loaded = source if isinstance(source, LoadedResults) else load_results(source)
    records: dict[Path, RunResult] = {}
    kept, skipped = [], list(loaded.skipped)
    for stored in loaded.found:
        if (problem := unreadable_result(stored.result)) is not None:  # records handed in, not read here
            skipped.append(
                f"skipped {stored.path}: {problem.why}; rerun that run with --force, or restore the file"
            )
            continue
        try:
            records[stored.path] = RunResult.from_json(stored.result)
        except ValueError as err:  # a key missing or unknown, here or in a stage or the cost
            skipped.append(
                f"skipped {stored.path}: not a complete result ({err}); rerun that run or complete the file"
            )
            continue
        kept.append(stored)
    return Results(LoadedResults(tuple(kept), tuple(skipped)), records)


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


def measurement_caveat(result: RunResult) -> str | None:
    """Why the run checks the code path rather than measuring anything (``not_a_measurement``,
    which reads the run's config alone), or None for a real result."""
    return not_a_measurement({"config": result.config})
