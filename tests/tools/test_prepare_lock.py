"""One ``prepare`` per (data root, target): two commands on one target, as two threads against a
slow local server. The second waits and says for whom, then finds the target prepared, or with
``--no-wait`` stops in one line; a lock left by a dead process is taken over."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.data.unit import dataset_unit
from benchmarks.data.units.imagenet_r import IMAGENET_R
from benchmarks.prepare import command as prepare
from benchmarks.prepare import lock as prepare_lock


def _imagenet_r_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for i in range(200):
            info = tarfile.TarInfo(f"imagenet-r/n{i:08d}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
    return buffer.getvalue()


BLOB = _imagenet_r_tar()


@pytest.fixture
def slow_server(monkeypatch):
    """Serves imagenet-r.tar after 1 s; ``started`` is set when the first request arrives."""
    archive = prepare.Archive(IMAGENET_R.url, hashlib.md5(BLOB).hexdigest())
    monkeypatch.setattr(dataset_unit("imagenet_r"), "archives", lambda: [archive])
    monkeypatch.setattr(prepare_lock, "POLL_SECONDS", 0.05)
    started, requests = threading.Event(), []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requests.append(self.path)
            started.set()
            time.sleep(1.0)
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.wfile.write(BLOB)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url, httpd.started, httpd.requests = (
        f"http://127.0.0.1:{httpd.server_address[1]}",
        started,
        requests,
    )
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _two_commands(server, root: Path, second_argv: list[str]) -> list[int]:
    """The first command, and once it downloads (holding the lock), the second."""
    argv = ["imagenet_r", "--data-root", str(root), "--mirror", server.url, "--quiet"]
    codes = {}

    def command(which: int, extra: list[str]) -> None:
        codes[which] = prepare.main(argv + extra)

    first = threading.Thread(target=command, args=(0, []))
    first.start()
    assert server.started.wait(10)
    second = threading.Thread(target=command, args=(1, second_argv))
    second.start()
    first.join(20)
    second.join(20)
    return [codes.get(0), codes.get(1)]


def test_the_second_command_waits_says_for_whom_and_finds_it_prepared(slow_server, tmp_path, capsys):
    root = tmp_path / "data"
    codes = _two_commands(slow_server, root, [])
    err = capsys.readouterr().err
    assert codes == [0, 0], err
    holder = f"pid {os.getpid()} on {socket.gethostname()}"
    assert f"imagenet_r: waiting for {holder}, since " in err and "which is preparing it" in err
    assert err.count("imagenet_r: ready at") == 1 and err.count("imagenet_r: already prepared") == 1
    assert "Traceback" not in err and len(slow_server.requests) == 1
    assert sorted(p.name for p in root.iterdir()) == ["archives", "imagenet-r"]  # no lock left


def test_no_wait_stops_the_second_command_in_one_line(slow_server, tmp_path, capsys):
    root = tmp_path / "data"
    codes = _two_commands(slow_server, root, ["--no-wait"])
    err = capsys.readouterr().err
    assert codes == [0, 2], err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert f"imagenet_r is being prepared by pid {os.getpid()} on {socket.gethostname()}" in line
    assert "--no-wait" in line and err.count("error: ") == 1 and "Traceback" not in err
    assert (root / "imagenet-r").is_dir()


def _lock_file(root: Path, pid: int) -> Path:
    path = prepare_lock.lock_path(root, "imagenet_r")
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": pid, "since": time.time(), "token": "other"}
    path.write_text(json.dumps(holder))
    return path


def test_list_names_the_holder_of_a_targets_lock(tmp_path, capsys):
    _lock_file(tmp_path, os.getpid())
    assert prepare.main(["--list", "--data-root", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| imagenet_r |"))
    assert f"| missing (being prepared by pid {os.getpid()} on {socket.gethostname()}" in row


def test_a_damaged_lock_is_named_as_such_not_as_pid_0(tmp_path, capsys):
    """A cut-off lock (a full disk) names no holder: ``--list`` says what it is and when it goes
    stale, in the runner's words, never "pid 0 on ?"."""
    path = prepare_lock.lock_path(tmp_path, "imagenet_r")
    path.write_text('{"host": "a", "pi')
    assert prepare.main(["--list", "--data-root", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| imagenet_r |"))
    assert f"a damaged lock file {path} (cut-off or invalid JSON)" in row and "pid 0" not in row


def _dead_pid() -> int:
    """A pid no process has on this host now."""
    for pid in range(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def test_a_lock_left_by_a_dead_process_is_taken_over(slow_server, tmp_path, capsys):
    lock = _lock_file(tmp_path / "data", _dead_pid())
    code = prepare.main(
        [
            "imagenet_r",
            "--data-root",
            str(tmp_path / "data"),
            "--mirror",
            slow_server.url,
            "--quiet",
            "--no-wait",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert not lock.exists()


def test_two_commands_in_one_slurm_job_keep_each_other_out(tmp_path, monkeypatch):
    """The runner takes over a lock held under its own job id (a requeued life); prepare does not:
    two srun steps of one job are two commands."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    first = prepare_lock.target_lock_file(tmp_path, "cifar100")
    second = prepare_lock.target_lock_file(tmp_path, "cifar100")
    assert first.acquire()
    try:
        assert not second.acquire()
    finally:
        first.release()
    assert second.acquire()
    second.release()
