"""What the command line refuses before any run starts, each in one line with exit 2: an empty
filter (an unset shell variable must not mean the whole suite), more threads than usable cores or
an empty ``--threads``, a ``--suite`` that is a folder or not UTF-8; and what ``--quiet`` silences."""

import pytest

from benchmarks import run
from benchmarks.core.environment import usable_cores
from benchmarks.core.errors import UserError
from benchmarks.runner import launcher
from tests.helpers import three_task_suite

SUITE = three_task_suite("continual_clip", "eval_batch_size = 100")


def _main(tmp_path, *extra) -> int:
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    return run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results"), "--quiet", *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("flag", ["--strategies", "--datasets", "--tasks", "--seeds"])
@pytest.mark.parametrize("value", ["", ","])
def test_an_empty_filter_is_refused_not_taken_for_the_whole_suite(tmp_path, capsys, flag, value):
    assert _main(tmp_path, flag, value, "--dry-run") == 2
    line = _one_line(capsys)
    assert f"{flag} is empty; name at least one" in line
    assert not (tmp_path / "results").exists()


def test_an_empty_seed_filter_is_refused_in_a_fast_dev_run_too(tmp_path, capsys):
    """A fast dev run takes the suite's first seed when none is given; an empty one is no seed given."""
    assert _main(tmp_path, "--seeds", "", "--fast-dev-run", "--dry-run") == 2
    assert "--seeds is empty" in _one_line(capsys)


@pytest.mark.parametrize("value", ["", "10000"])
def test_threads_empty_or_above_the_usable_cores_are_refused(tmp_path, capsys, value):
    assert _main(tmp_path, "--threads", value) == 2
    line = _one_line(capsys)
    if value:
        assert f"threads 10000 is more than the {usable_cores()} core(s) this process may use" in line
    else:
        assert "threads must be a whole number >= 1 or \"auto\", not ''" in line
    assert not (tmp_path / "results").exists()


def test_a_suites_threads_above_the_usable_cores_are_refused(tmp_path, capsys):
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.replace('device = "cpu"', f'device = "cpu"\nthreads = {usable_cores() + 1}'))
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "r"), "--dry-run"]) == 2
    assert "is more than the" in _one_line(capsys)


def test_threads_up_to_the_usable_cores_pass(tmp_path, capsys):
    assert _main(tmp_path, "--threads", str(usable_cores()), "--dry-run") == 0


def test_a_suite_that_is_a_folder_or_not_utf8_is_one_line(tmp_path, capsys):
    folder = tmp_path / "x.toml"
    folder.mkdir()
    assert run.main(["--suite", str(folder), "--dry-run"]) == 2
    assert "is a folder, not a suite file" in _one_line(capsys)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(SUITE.encode() + "# caf\xe9\n".encode("latin-1"))
    assert run.main(["--suite", str(latin), "--dry-run"]) == 2
    line = _one_line(capsys)
    assert f"suite file {latin} is not UTF-8 text" in line and "save it as UTF-8" in line


def test_quiet_silences_the_start_banner_before_a_one_line_error(tmp_path, capsys, monkeypatch):
    def fails(self, runs, store, options):
        raise UserError("the run could not start")

    monkeypatch.setattr(launcher.InlineLauncher, "launch", fails)
    assert _main(tmp_path) == 2
    assert _one_line(capsys) == "error: the run could not start"
    suite = tmp_path / "suite.toml"
    assert run.main(["--suite", str(suite), "--results-dir", str(tmp_path / "results")]) == 2
    assert "suite 'suite'" in capsys.readouterr().err  # the banner, without --quiet


@pytest.mark.parametrize("flag", ["--results-dir", "--data-root", "--weights", "--rates"])
def test_an_empty_path_is_refused_never_taken_for_the_default(tmp_path, capsys, monkeypatch, flag):
    monkeypatch.chdir(tmp_path)
    assert run.main(["--suite", "smoke", flag, "", "--force"]) == 2
    assert _one_line(capsys).startswith(f"error: {flag} is empty; give a path")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("seeds", ["-1", "4294967296", "20000000000000"])
def test_a_seed_out_of_range_is_one_line_before_any_run(tmp_path, capsys, seeds):
    assert _main(tmp_path, "--seeds", seeds, "--dry-run") == 2
    assert f"--seeds must be whole numbers from 0 to 4294967295 (2**32 - 1), not {seeds}" in _one_line(capsys)
    suite = tmp_path / "big.toml"
    suite.write_text(SUITE.replace("seeds = [0]", f"seeds = [{seeds}]"))
    assert run.main(["--suite", str(suite), "--dry-run"]) == 2
    assert f"seeds must be whole numbers from 0 to 4294967295 (2**32 - 1), not {seeds}" in _one_line(capsys)
