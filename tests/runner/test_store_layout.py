"""The results store reads its own layout back (``ResultStore.result_files``, ``checkpoint_states``,
``run_keys``, ``leftovers``, ``results``): the tools (status, kill_rerun, gpu_check, shared_cores)
ask it, so only the store, its reader and docs/results-schema.md know where a run's files lie."""

import shutil
from pathlib import Path

from benchmarks.core.atomic_io import write_json
from benchmarks.runner import status
from benchmarks.runner.results import ResultStore, RunKey

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "results" / "smoke-baselines" / "synthetic" / "clap" / "T10-seed0.json"


def _store(tmp_path: Path) -> tuple[ResultStore, dict[str, RunKey]]:
    """A store holding one of each thing a run leaves: a result (and its sidecar), a checkpoint, a
    lock, an error and a queued record, each of another run; and files that are none of these."""
    store = ResultStore(tmp_path / "results")
    keys = {
        "result": RunKey("clap", "synthetic", 10, 0),
        "checkpoint": RunKey("gr4cil", "synthetic", 10, 1),
        "lock": RunKey("gr4cil", "cifar100", 10, 2, split="B50-Inc10"),
        "error": RunKey("l2p_pp", "synthetic", 5, 0, order="seed5"),
        "queued": RunKey("my_pkg.mod_Class", "synthetic", 10, 3),
    }
    result = store.result_path(keys["result"])
    result.parent.mkdir(parents=True)
    shutil.copy(STORED, result)
    shutil.copy(STORED.with_name("T10-seed0.predictions.safetensors"), result.parent)
    write_json(store.checkpoint_state_path(keys["checkpoint"]), {"tasks_done": 4})
    lock = store.lock(keys["lock"])
    lock.path.parent.mkdir(parents=True)
    lock.path.write_text("{}")
    store.lock(keys["error"]).path.parent.mkdir(parents=True)  # made by the lock a failed run held
    store.lock(keys["error"]).mark_failed("boom", job="")
    store.lock(keys["queued"]).mark_queued("123")
    # none of these is a run's file: another JSON beside a result, a hidden folder, a deeper file
    (result.parent / "T10-seed0.model.json").write_text("{}")
    (store.root / ".logs" / "slurm").mkdir(parents=True)
    (store.root / ".logs" / "slurm" / "T1-seed0.json").write_text("{}")
    (store.root / "synthetic" / "clap" / "old" / "T10-seed9.json").parent.mkdir()
    (store.root / "synthetic" / "clap" / "old" / "T10-seed9.json").write_text("{}")
    return store, keys


def test_the_store_names_each_runs_files_and_nothing_else(tmp_path):
    store, keys = _store(tmp_path)
    assert store.result_files() == [(keys["result"], store.result_path(keys["result"]))]
    assert store.checkpoint_states() == [
        (keys["checkpoint"], store.checkpoint_state_path(keys["checkpoint"]))
    ]
    assert store.run_keys() == set(keys.values())
    skipped: list[str] = []
    (path, result), *others = list(store.results(skipped))
    assert not others and path == store.result_path(keys["result"]) and result.label == "clap"
    # a file by a result's name outside a result's place is no run's file, and the reader names it
    assert len(skipped) == 1 and "clap/old/T10-seed9.json: not a result" in skipped[0]
    assert store.leftovers() == sorted(
        [store.checkpoint_state_path(keys["checkpoint"]), store.lock(keys["lock"]).path]
    )
    # the status lists the same runs, a result's label taken from the result itself
    assert set(status.known_runs(store)) == set(keys.values())


def test_an_empty_or_absent_store_holds_nothing(tmp_path):
    for store in (ResultStore(tmp_path / "absent"), ResultStore(tmp_path)):
        assert store.result_files() == store.checkpoint_states() == store.leftovers() == []
        assert store.run_keys() == set() and list(store.results()) == []


def test_an_interrupted_write_is_a_leftover(tmp_path):
    store, keys = _store(tmp_path)
    temp = store.result_path(keys["result"]).parent / ".T10-seed0.json.host-1.abc.tmp"
    temp.write_text("{")
    assert temp in store.leftovers()
    assert [key for key, _ in store.result_files()] == [keys["result"]]


def test_a_locks_private_and_set_aside_files_are_leftovers(tmp_path):
    """What an interrupted ``HeartbeatLock._create`` or takeover could leave beside a lock."""
    store, keys = _store(tmp_path)
    lock = store.lock(keys["lock"]).path
    private = lock.with_name(f"{lock.name}.new-0123abcd")
    aside = lock.with_name(f"{lock.name}.stale-0123abcd")
    private.write_text("{}")
    aside.write_text("{}")
    assert {private, aside} <= set(store.leftovers())
    assert store.run_keys() == set(keys.values())  # neither is a run of its own
