"""Every command answers a bad or missing argument in one line, ``error: <what>``, with exit code 2:
no usage block, no traceback (``benchmarks.core.errors.CommandParser`` and
``one_line_user_errors``). Each case runs the command's ``main`` in this process; a few run it as
``python -m`` in a real process, where a traceback would show."""

import errno
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.core.errors import (
    STORAGE_ERROR_CLASSES,
    UserError,
    one_line_storage_errors,
    one_line_user_errors,
)

ROOT = Path(__file__).resolve().parents[2]

# (module, argv, a fragment of the one line): "{tmp}" is a fresh empty folder, "{file}" a file in it
CASES = [
    ("benchmarks.run", ["--seeds", "x"], "expected a comma-separated list, got 'x'"),
    ("benchmarks.run", ["--launcher", "moon"], "argument --launcher: invalid choice: 'moon'"),
    ("benchmarks.run", ["--bogus"], "unrecognized arguments: --bogus"),
    ("benchmarks.prepare.command", ["--bogus"], "unrecognized arguments: --bogus"),
    ("benchmarks.tools.fake_data", [], "the following arguments are required: --data-root"),
    ("benchmarks.tools.fake_data", ["--data-root", "{tmp}", "--seed", "a"], "--seed: invalid int value: 'a'"),
    (
        "benchmarks.tools.fake_data",
        ["--data-root", "{tmp}", "--datasets", "mnist"],
        "unknown dataset 'mnist'",
    ),
    (
        "benchmarks.tools.fake_data",
        ["--data-root", "{tmp}", "--datasets", ","],
        "--datasets names no dataset",
    ),
    ("benchmarks.tools.fake_data", ["--data-root", "{tmp}", "--train-per-class", "0"], "must be at least 1"),
    ("benchmarks.tools.fake_data", ["--data-root", "{file}"], "cannot write the fake data"),
    ("benchmarks.tools.resized_cache", [], "the following arguments are required: DATASET"),
    (
        "benchmarks.tools.resized_cache",
        ["imagenet_r", "--image-size", "x"],
        "--image-size: invalid int value",
    ),
    (
        "benchmarks.tools.resized_cache",
        ["imagenet_r", "--image-size", "0"],
        "--image-size must be at least 1",
    ),
    ("benchmarks.tools.resized_cache", ["mnist"], "unknown dataset 'mnist'"),
    ("benchmarks.tools.resized_cache", ["imagenet_r", "--data-root", "{tmp}"], "ImageNet-R not found"),
    ("analysis.compare", [], "the following arguments are required: --results-dir"),
    ("analysis.compare", ["--results-dir", "{tmp}", "--metric", "best"], "--metric: invalid choice: 'best'"),
    ("analysis.compare", ["--results-dir", "{tmp}", "--draws", "0"], "--draws 0 is too few"),
    ("analysis.compare", ["--results-dir", "{tmp}", "--draws", "-5"], "--draws -5 is too few"),
    ("analysis.compare", ["--results-dir", "{tmp}", "--out", "{file}"], "is a file, not a folder"),
    ("analysis.compare", ["--results-dir", "{tmp}", "--out", "{file}/sub"], "is a file, not a folder"),
    ("analysis.compare", ["--results-dir", "{tmp}"], "no result JSON found"),
    ("analysis.protocol_effect", [], "required: --one-protocol, --as-published"),
    ("analysis.protocol_effect", ["--one-protocol", "{tmp}"], "required: --as-published"),
    (
        "analysis.protocol_effect",
        ["--one-protocol", "{tmp}", "--as-published", "{tmp}", "--draws", "0"],
        "too few",
    ),
    (
        "analysis.protocol_effect",
        ["--one-protocol", "{tmp}", "--as-published", "{tmp}", "--draws", "-5"],
        "too few",
    ),
    (
        "analysis.protocol_effect",
        ["--one-protocol", "{tmp}", "--as-published", "{tmp}", "--out", "{file}"],
        "--out {file} is a file, not a folder",
    ),
    ("analysis.protocol_effect", ["--one-protocol", "{tmp}", "--as-published", "{tmp}"], "no result JSON"),
    ("analysis.tables", [], "the following arguments are required: --results-dir"),
    ("analysis.tables", ["--results-dir", "{tmp}"], "no result JSON found"),
    ("analysis.report", ["--results-dir", "{tmp}"], "the following arguments are required: --out"),
    ("analysis.report", ["--results-dir", "{tmp}", "--out", "{file}"], "--out {file} is a file"),
    (
        "analysis.report",
        ["--results-dir", "{tmp}", "--out", "{tmp}/r", "--only", "x"],
        "unknown table or figure",
    ),
    ("analysis.reproducibility", ["--bogus"], "unrecognized arguments: --bogus"),
    # a results folder that is missing or a file, for every command that reads one
    ("analysis.tables", ["--results-dir", "{tmp}/none"], "--results-dir {tmp}/none does not exist"),
    ("analysis.tables", ["--results-dir", "{file}"], "--results-dir {file} is a file, not a folder"),
    ("benchmarks.runner.status", ["--results-dir", "{file}"], "--results-dir {file} is a file, not a folder"),
    ("benchmarks.runner.status", ["--results-dir", "{tmp}/none"], "--results-dir {tmp}/none does not exist"),
    ("analysis.reproducibility", ["--results-dir", "{tmp}/none", "--out", "{tmp}/R.md"], "does not exist"),
    ("analysis.report", ["--results-dir", "{file}", "--out", "{tmp}/r"], "--results-dir {file} is a file"),
    (
        "analysis.report",
        ["--results-dir", "{file}", "--out", "{tmp}/r", "--by-suite"],
        "is a file, not a folder",
    ),
    ("benchmarks.tools.speed", ["--only", "nothing"], "--only: invalid choice: 'nothing'"),
    ("benchmarks.tools.speed", ["--tasks", "x"], "--tasks: invalid int value: 'x'"),
    ("benchmarks.tools.speed", ["--train", "--steps", "0"], "--steps must be at least 1"),
    ("benchmarks.tools.speed", ["--train", "--steps-for", "l2p_pp"], "give NAME=STEPS"),
    ("benchmarks.tools.loader_speed", ["--epochs", "x"], "--epochs: invalid int value: 'x'"),
    ("benchmarks.tools.walk", ["--bogus"], "unrecognized arguments: --bogus"),
    ("benchmarks.tools.walk", ["--data-root", "{file}/data"], "cannot write the fake data"),
    ("tests.official.goldens.__main__", [], "give --official-root DIR"),
    ("tests.official.goldens.__main__", ["--bogus"], "unrecognized arguments: --bogus"),
    ("benchmarks.miniature.pretrain", ["--steps", "x"], "--steps: invalid int value: 'x'"),
    ("benchmarks.miniature.report", ["--bogus"], "unrecognized arguments: --bogus"),
    ("benchmarks.miniature.clap_diagnosis", ["--seed", "x"], "--seed: invalid int value: 'x'"),
    ("benchmarks.runner.status", [], "the following arguments are required: --results-dir"),
]


def _fill(words: list[str], tmp_path: Path) -> list[str]:
    (tmp_path / "a-file").write_text("not a folder")
    return [w.replace("{tmp}", str(tmp_path)).replace("{file}", str(tmp_path / "a-file")) for w in words]


@pytest.mark.parametrize(
    "module, argv, fragment",
    [
        pytest.param(*case, id=f"{case[0].split('.')[-1]}: {' '.join(case[1]) or '(nothing)'}")
        for case in CASES
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(module, argv, fragment, tmp_path, capsys):
    main = importlib.import_module(module).main
    argv, fragment = _fill(argv, tmp_path), _fill([fragment], tmp_path)[0]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's errors (CommandParser) end the process, as they should
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and fragment in err[0], err


@pytest.mark.parametrize("module", ["analysis.tables", "analysis.compare"])
def test_a_folder_of_damaged_results_only_names_them_in_its_one_line(module, tmp_path, capsys):
    damaged = tmp_path / "synthetic" / "gr4cil" / "T10-seed0.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"\xff\xfe")  # not UTF-8
    assert importlib.import_module(module).main(["--results-dir", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: no result JSON found under ")
    assert f"(skipped corrupt result file {damaged} (not UTF-8 text" in line


# A run whose class order numpy cannot seed stops before any run, in one line (preflight).
RUN_ARGV = ["--suite", "smoke", "--strategies", "continual_clip", "--seeds", "0", "--tasks", "2", "--quiet"]


@pytest.mark.slow  # another Python process each, 5 to 20 s on 2 cores
@pytest.mark.parametrize(
    "module, argv, fragment",
    [
        ("benchmarks.tools.fake_data", [], "required: --data-root; see python -m benchmarks.tools.fake_data"),
        ("analysis.compare", ["--results-dir", "{tmp}", "--out", "{file}"], "is a file, not a folder"),
        (
            "analysis.protocol_effect",
            ["--one-protocol", "{tmp}", "--as-published", "{tmp}", "--draws", "0"],
            "few",
        ),
        ("benchmarks.run", [*RUN_ARGV, "--class-order", "seed-5", "--results-dir", "{tmp}/r"], "seed-5"),
    ],
    ids=["fake_data", "compare", "protocol_effect", "run"],
)
def test_in_a_real_process_the_line_is_all_there_is(module, argv, fragment, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", module, *_fill(argv, tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    fragment = _fill([fragment], tmp_path)[0]
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("error: ") and fragment in err[0] and "Traceback" not in done.stderr
    assert "usage:" not in done.stdout + done.stderr


#: every errno of every storage class on this platform, named (the class is what the code lists)
STORAGE_CODES = {
    name: getattr(errno, name)
    for names in STORAGE_ERROR_CLASSES.values()
    for name in names
    if hasattr(errno, name)
}


def test_the_storage_classes_hold_the_cases_seen_and_no_code_mistake():
    seen = {
        "ENOSPC",
        "EDQUOT",
        "EFBIG",
        "EACCES",
        "EROFS",
        "EISDIR",
        "ELOOP",
        "ENAMETOOLONG",
        "EIO",
        "ESTALE",
    }
    assert seen <= STORAGE_CODES.keys()
    assert not {"EBADF", "EFAULT", "EINVAL", "ENOENT", "ESPIPE", "ECONNREFUSED"} & STORAGE_CODES.keys()


@pytest.mark.parametrize("name", STORAGE_CODES)
def test_only_a_storage_error_becomes_one_line_any_other_passes_as_it_is(name):
    code = STORAGE_CODES[name]
    cause = os.strerror(code)
    with pytest.raises(UserError) as refused:
        with one_line_storage_errors("write the table", "free space"):
            raise OSError(code, cause, "/data/t.md")
    assert str(refused.value) == f"cannot write the table (/data/t.md): {cause}; free space"
    with pytest.raises(OSError) as bug:  # a closed descriptor is the code's mistake, not the disk's
        with one_line_storage_errors("write the table", "free space"):
            raise OSError(errno.EBADF, "Bad file descriptor")
    assert bug.value.errno == errno.EBADF and not isinstance(bug.value, UserError)


def test_a_character_the_terminal_lacks_is_escaped_not_a_traceback(monkeypatch):
    import io

    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")  # as PYTHONIOENCODING=ascii, or a C locale
    monkeypatch.setattr(sys, "stdout", ascii_out)

    @one_line_user_errors
    def main() -> int:
        print("| café | 61.39 |")
        return 0

    assert main() == 0
    ascii_out.flush()
    assert raw.getvalue() == b"| caf\\xe9 | 61.39 |\n"
