"""``benchmarks.core.atomic_io``: a file is written whole or not at all. A write that fails or is
interrupted part-way keeps the old content and leaves no temporary file; a reader never sees half
a file; a new file is readable as ``open`` would make it; a corrupt JSON file is one line."""

import json
import math
import os
import threading

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.core.atomic_io import (
    atomic_write_bytes,
    atomic_write_text,
    read_json,
    read_tensors,
    write_json,
    write_tensors,
)
from benchmarks.core.errors import UserError


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _fail_half_way(monkeypatch, error: BaseException) -> list[bytes]:
    """Make the next atomic write put half its bytes on disk, then raise ``error``; returns, once it
    has, what the temporary file held at that moment (to show the write really was cut short)."""
    real_fdopen = os.fdopen
    seen = []

    class HalfWriter:
        def __init__(self, fd, mode):
            self.handle = real_fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.handle.close()

        def write(self, blob):
            self.handle.write(blob[: len(blob) // 2])
            self.handle.flush()
            seen.append(os.pread(self.handle.fileno(), len(blob), 0))
            raise error

    monkeypatch.setattr(os, "fdopen", HalfWriter)
    return seen


def test_a_write_replaces_the_file_whole_and_makes_its_folder(tmp_path):
    path = tmp_path / "a" / "b" / "r.txt"
    atomic_write_text(path, "first")
    atomic_write_text(path, "second, longer")
    assert path.read_text() == "second, longer"
    assert _names(path.parent) == ["r.txt"]  # no temporary file left


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_write_cut_short_keeps_the_old_content_and_leaves_no_partial_file(tmp_path, monkeypatch, error):
    path = tmp_path / "r.json"
    atomic_write_text(path, "old content")
    seen = _fail_half_way(monkeypatch, error)
    with pytest.raises(type(error)):
        atomic_write_text(path, "new content, twice as long as the half")
    assert seen == [b"new content, twice "]  # half the bytes were on disk, in the temporary file
    assert path.read_text() == "old content"
    assert _names(tmp_path) == ["r.json"]


def test_a_first_write_that_fails_leaves_no_file_at_all(tmp_path, monkeypatch):
    _fail_half_way(monkeypatch, OSError(5, "Input/output error"))
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "new.bin", b"0123456789")
    assert _names(tmp_path) == []


def test_a_failure_before_the_rename_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "r.txt"
    atomic_write_text(path, "old")

    def fsync_fails(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="Input/output error"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and _names(tmp_path) == ["r.txt"]


def test_a_reader_sees_the_old_file_or_the_new_one_never_half(tmp_path):
    path = tmp_path / "big.bin"
    versions = [bytes([0]) * 2**18, bytes([1]) * 2**18]
    atomic_write_bytes(path, versions[0])
    done, torn = threading.Event(), []

    def read_until_done():
        while not done.is_set():
            if path.read_bytes() not in versions:
                torn.append(1)

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        for i in range(60):
            atomic_write_bytes(path, versions[i % 2])
    finally:
        done.set()
        reader.join()
    assert not torn and path.read_bytes() == versions[1]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_a_new_file_has_the_mode_open_would_give_it(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "r.txt", "x")
    finally:
        os.umask(previous)
    assert (tmp_path / "r.txt").stat().st_mode & 0o777 == mode  # not mkstemp's 0600


def test_json_is_written_one_space_indented_with_a_final_newline_and_reads_back(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"b": [1, 2.5], "a": None})
    assert path.read_text() == '{\n "b": [\n  1,\n  2.5\n ],\n "a": null\n}\n'
    assert read_json(path) == {"b": [1, 2.5], "a": None}


def test_json_refuses_nan_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"acc": 0.5})
    with pytest.raises(ValueError):
        write_json(path, {"acc": math.nan})
    assert json.loads(path.read_text()) == {"acc": 0.5} and _names(tmp_path) == ["r.json"]


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b'{"a": 1,\n', "Expecting property name enclosed in double quotes at line 2"),
        (b"", "Expecting value at line 1"),
        (b'\xff\xfe{"a": 1}', "not UTF-8 text: byte 0: invalid start byte"),
        ('{"label": "caf\u00e9"}'.encode("latin-1"), "not UTF-8 text: byte 14: invalid continuation byte"),
    ],
)
def test_a_corrupt_json_file_is_one_line_that_names_it_and_the_fix(tmp_path, blob, reason):
    path = tmp_path / "r.json"
    path.write_bytes(blob)
    with pytest.raises(UserError) as error:
        read_json(path)
    assert str(error.value) == (
        f"corrupt result file {path} ({reason}); delete it and rerun, or rerun with --force"
    )


def test_tensors_are_written_as_one_safetensors_file(tmp_path):
    tensors = {"lora/a": torch.arange(6.0).view(2, 3), "state/b": torch.tensor([1, 2], dtype=torch.int64)}
    write_tensors(tmp_path / "m.safetensors", tensors)
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded.keys() == tensors.keys() and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    assert _names(tmp_path) == ["m.safetensors"]


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_text(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def _temp(folder, target: str, writer: str):
    path = folder / f".{target}.{writer}abcd1234.tmp"
    path.write_bytes(b"half a file")
    return path


def test_the_next_write_removes_the_temps_that_interrupted_writes_of_the_same_file_left(tmp_path):
    """A dead writer's temp goes at the next write of the same file; a live writer's, a fresh one of
    another host's, and any other file's temps stay (they may be under way)."""
    from benchmarks.core import atomic_io

    host = atomic_io._host()
    dead_pid = int(open("/proc/sys/kernel/pid_max").read())  # pids lie below pid_max: never alive
    dead = _temp(tmp_path, "T10-seed0.json", f"{host}-{dead_pid}.")
    live = _temp(tmp_path, "T10-seed0.json", f"{host}-{os.getppid()}.")
    elsewhere = _temp(tmp_path, "T10-seed0.json", "other-node-12.")
    old_elsewhere = _temp(tmp_path, "T10-seed0.json", "other-node-13.")
    unnamed = _temp(tmp_path, "T10-seed0.json", "")  # a writer before names held the writer
    aged = atomic_io.STALE_TEMP_SECONDS + 60
    for path in (old_elsewhere, unnamed):
        os.utime(path, (os.path.getmtime(path) - aged,) * 2)
    sidecar = _temp(tmp_path, "T10-seed0.predictions.safetensors", f"{host}-{dead_pid}.")
    write_json(tmp_path / "T10-seed0.json", {"a": 1})
    assert _names(tmp_path) == sorted(["T10-seed0.json", live.name, elsewhere.name, sidecar.name])
    assert not dead.exists()
    atomic_write_bytes(tmp_path / "T10-seed0.predictions.safetensors", b"blob")  # its own temps go
    assert not sidecar.exists()


@pytest.mark.slow
def test_a_write_killed_before_its_rename_leaves_a_temp_that_the_next_write_removes(tmp_path):
    """kill -9 between the temporary file and the rename, as a killed run can be."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "T10-seed0.json"
    script = (
        "import os, sys, time\n"
        "from benchmarks.core import atomic_io\n"
        "os.replace = lambda *a: (print('written', flush=True), time.sleep(60))\n"
        f"atomic_io.write_json({str(path)!r}, {{'a': 1}})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (debris,) = tmp_path.iterdir()
    assert debris.name.startswith(".T10-seed0.json.") and debris.name.endswith(".tmp")
    write_json(path, {"a": 2})
    assert _names(tmp_path) == ["T10-seed0.json"] and read_json(path) == {"a": 2}


def test_tensors_that_share_memory_are_saved_once_and_read_back_shared(tmp_path):
    weight = torch.arange(12.0).reshape(3, 4)
    tensors = {
        "network/fc.weight": weight,
        "learner/alias": weight.view(3, 4),  # the same view through another tensor object
        "learner/row": weight[1],  # another view of the same memory
        "learner/own": torch.ones(2),
        "learner/empty": torch.zeros(0),
    }
    path = tmp_path / "task-01.safetensors"
    write_tensors(path, tensors)  # safetensors alone refuses these
    on_disk = load_file(str(path))
    assert "learner/alias" not in on_disk and set(on_disk) == set(tensors) - {"learner/alias"}
    read = read_tensors(path)
    assert set(read) == set(tensors)
    assert all(torch.equal(read[name], value) for name, value in tensors.items())
    assert read["learner/alias"] is read["network/fc.weight"]


@pytest.mark.parametrize(
    "content",
    [b"[]", b'"a record"', b"{", b"\xff\xfe", b'{"tasks_done": "2"}', b'{"tasks_done": true}', b"{}"],
)
def test_a_damaged_record_reads_as_none_whatever_its_damage(tmp_path, content):
    from benchmarks.core.atomic_io import read_json_object

    path = tmp_path / "state.json"
    path.write_bytes(content)
    assert read_json_object(path, tasks_done=int) is None
    assert read_json_object(tmp_path / "missing.json") is None
    assert read_json_object(tmp_path) is None  # a folder where the record belongs
    path.write_text('{"tasks_done": 2, "config_hash": "ab"}')
    assert read_json_object(path, tasks_done=int) == {"tasks_done": 2, "config_hash": "ab"}


def test_an_owned_temp_dir_removes_those_dead_processes_of_this_host_left(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from benchmarks.core.atomic_io import _host, owned_temp_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is free now (reused only after the kernel wraps around)
    checkout = tmp_path / "checkout-utils"
    (checkout / "keep.json").parent.mkdir()
    (checkout / "keep.json").write_text("{}")
    left = tmp_path / f"run-{_host()}-{dead.pid}-abc"
    left.mkdir()
    (left / "utils").symlink_to(checkout, target_is_directory=True)  # as a C3Box run's folder holds
    alive = tmp_path / f"run-{_host()}-{os.getpid()}-def"
    other_host = tmp_path / f"run-elsewhere.example-{dead.pid}-ghi"
    alive.mkdir()
    other_host.mkdir()

    new = owned_temp_dir("run-")
    assert new.is_dir() and new.parent == tmp_path and new.name.startswith(f"run-{_host()}-{os.getpid()}-")
    assert not left.exists() and (checkout / "keep.json").exists()  # the link went, not what it names
    assert alive.is_dir() and other_host.is_dir()
