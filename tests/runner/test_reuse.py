"""A run whose exact config already has a finished result in another results folder (a shared
store named by ``--reuse-from``, or a base suite's ``runs/BASE``) is copied, not recomputed, and
says so; a damaged copy or another config is never taken."""

import hashlib
import json

import pytest

from benchmarks import run
from benchmarks.runner.reading import iter_results
from benchmarks.runner.results import ResultStore
from benchmarks.runner.run_key import RunKey
from tests.helpers import three_task_suite


def _suite(tmp_path, seeds="[0]"):
    path = tmp_path / "suite.toml"
    path.write_text(three_task_suite("continual_clip", "").replace("seeds = [0]", f"seeds = {seeds}"))
    return path


def _files(folder):
    """Every result and sidecar under ``folder``, by relative path, with its bytes' SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.glob("*/*/T*-seed*.*")
    }


@pytest.mark.slow
def test_a_finished_run_elsewhere_is_copied_byte_for_byte_and_said(tmp_path, capsys):
    suite = _suite(tmp_path)
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    assert run.main(["--suite", str(suite), "--results-dir", str(shared)]) == 0
    capsys.readouterr()

    argv = ["--suite", str(suite), "--results-dir", str(mine), "--reuse-from", str(shared)]
    assert run.main([*argv, "--dry-run"]) == 0
    assert f"| to reuse (finished in {shared.resolve()}) |" in capsys.readouterr().out
    assert run.main(argv) == 0
    err = capsys.readouterr().err
    assert f": reused from {shared.resolve()} (a finished result of the same config; not recomputed)" in err
    assert _files(mine) == _files(shared) and len(_files(mine)) == 2  # the JSON and its sidecar
    assert not (mine / ".checkpoints").exists() or not any((mine / ".checkpoints").rglob("*.safetensors"))

    # the copy is a finished run of this folder: the next command finds it cached
    assert run.main(argv) == 0
    assert ": cached; Avg " in capsys.readouterr().err


@pytest.mark.slow
def test_a_base_suites_folder_is_looked_in_without_being_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    smoke = ["--suite", "smoke", "--strategies", "continual_clip", "--seeds", "0", "--launcher", "inline"]
    assert run.main(smoke) == 0  # into runs/smoke, the smoke suite's own folder
    capsys.readouterr()
    mine = tmp_path / "mine.toml"
    mine.write_text('base = "smoke"\nstrategies = ["continual_clip"]\nseeds = [0]\n')
    assert run.main(["--suite", str(mine), "--launcher", "inline"]) == 0
    err = capsys.readouterr().err
    assert f"reused from {(tmp_path / 'runs' / 'smoke').resolve()}" in err
    assert _files(tmp_path / "runs" / "mine") == _files(tmp_path / "runs" / "smoke")
    # the local launcher copies before it starts a worker: here none is needed
    local = tmp_path / "local"
    assert run.main(["--suite", str(mine), "--workers", "2", "--results-dir", str(local)]) == 0
    err = capsys.readouterr().err
    assert (
        f"reused from {(tmp_path / 'runs' / 'smoke').resolve()}" in err and "local worker(s) share" not in err
    )
    assert _files(local) == _files(tmp_path / "runs" / "smoke")


@pytest.mark.slow
def test_reuse_takes_only_an_intact_result_of_the_same_config(tmp_path):
    source = tmp_path / "source"
    assert run.main(["--suite", str(_suite(tmp_path)), "--results-dir", str(source), "--quiet"]) == 0
    ((path, result),) = list(iter_results(source))
    key, config_hash = RunKey("continual_clip", "synthetic", 3, 0), result["config_hash"]
    assert ResultStore(source).result_path(key) == path
    here = ResultStore(tmp_path / "here")
    assert here.reuse(key, "another-config", [source]) is None
    assert here.reuse(key, config_hash, [tmp_path / "here"]) is None  # itself is no source
    sidecar = path.parent / result["predictions"]["file"]
    intact = sidecar.read_bytes()
    sidecar.write_bytes(intact[:-1] + bytes([intact[-1] ^ 1]))  # one bit flipped
    assert here.reuse(key, config_hash, [source]) is None and not here.result_path(key).exists()
    sidecar.write_bytes(intact)
    copied, came_from = here.reuse(key, config_hash, [tmp_path / "missing", source])
    assert came_from == source and copied.config_hash == config_hash
    assert here.result_path(key).read_bytes() == path.read_bytes()
    assert json.loads(here.result_path(key).read_text())["predictions"] == result["predictions"]


def test_a_reuse_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    argv = ["--suite", str(_suite(tmp_path)), "--results-dir", str(tmp_path / "r")]
    assert run.main([*argv, "--reuse-from", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: --reuse-from {tmp_path / 'nowhere'}: no such folder; give a folder of results"]
