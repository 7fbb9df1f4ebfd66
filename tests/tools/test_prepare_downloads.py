"""``prepare`` against a hostile HTTP server on 127.0.0.1 (a thread, started per test) and against
local mirror folders and the user's own archives. One test per behaviour; each ends in one line
with exit 2 and nothing half-written (at most the hidden ``.part`` a rerun resumes), or succeeds.
The rate limits are set small (``--min-rate 1000 --rate-window 0.5``) so a trickle ends in about a
second."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.data.unit import dataset_unit
from benchmarks.data.units.imagenet_r import IMAGENET_R
from benchmarks.prepare import command as prepare

FAST = ["--min-rate", "1000", "--rate-window", "0.5", "--quiet"]


def _imagenet_r_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for i in range(200):
            info = tarfile.TarInfo(f"imagenet-r/n{i:08d}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        info = tarfile.TarInfo("imagenet-r/n00000000/1.jpg")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"jpeg"))
    return buffer.getvalue()


BLOB = _imagenet_r_tar()


@pytest.fixture(autouse=True)
def official_checksum(monkeypatch):
    archive = prepare.Archive(IMAGENET_R.url, hashlib.md5(BLOB).hexdigest())
    monkeypatch.setattr(dataset_unit("imagenet_r"), "archives", lambda: [archive])


class Hostile:
    """A server whose every GET is ``answer(handler, n)`` (n: the request's number, from 0); the
    requests' paths and Range headers are kept in ``requests``."""

    def __init__(self, answer) -> None:
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                try:
                    answer(self, len(server.requests) - 1)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on us: what these tests want

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(answer) -> Hostile:
        servers.append(Hostile(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _run(capsys, root: Path, mirror: str, *extra: str) -> tuple[int, str]:
    code = prepare.main(["imagenet_r", "--data-root", str(root), "--mirror", mirror, *FAST, *extra])
    return code, capsys.readouterr().err


def _one_line(code: int, err: str) -> None:
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def _nothing_written(root: Path) -> None:
    assert not (root / "imagenet-r").exists() and not list(root.glob(".prepare-*"))
    assert not (root / "archives").exists() or list((root / "archives").iterdir()) == []


def _range_start(handler) -> int:
    header = handler.headers.get("Range")
    return int(header.split("=")[1].split("-")[0]) if header else 0


def test_a_trickling_body_ends_in_one_line_and_keeps_its_bytes(serve, tmp_path, capsys):
    def trickle(handler, n):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(BLOB)))
        handler.end_headers()
        for byte in BLOB[:50]:  # one byte every 0.2 s: no socket timeout ever trips
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)

    server, root = serve(trickle), tmp_path / "data"
    started = time.monotonic()
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "too slow" in err and "--min-rate" in err and time.monotonic() - started < 5
    part = root / "archives" / "imagenet-r.tar.part"
    assert 0 < part.stat().st_size < 50 and f"the {part.stat().st_size} bytes received are kept" in err
    assert not (root / "imagenet-r").exists() and not (root / "archives" / "imagenet-r.tar").exists()


def test_trickling_headers_end_in_one_line(serve, tmp_path, capsys):
    def trickle(handler, n):
        for byte in b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n":
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)

    server, root = serve(trickle), tmp_path / "data"
    started = time.monotonic()
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "too slow" in err and time.monotonic() - started < 5
    _nothing_written(root)


def test_http_416_without_a_range_request_is_one_line(serve, tmp_path, capsys):
    server, root = serve(lambda handler, n: handler.send_error(416)), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "HTTP 416 to a request without a range" in err and server.requests[0][1] is None
    _nothing_written(root)


def test_a_content_length_that_is_not_a_number_is_one_line(serve, tmp_path, capsys):
    def bad_length(handler, n):
        handler.send_response(200)
        handler.send_header("Content-Length", "abc")
        handler.end_headers()
        handler.wfile.write(BLOB)

    server, root = serve(bad_length), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "Content-Length that is not a number ('abc')" in err
    _nothing_written(root)


def test_a_redirect_loop_is_one_line(serve, tmp_path, capsys):
    def loop(handler, n):
        handler.send_response(302)
        handler.send_header("Location", "/b" if handler.path != "/b" else "/imagenet-r.tar")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    server, root = serve(loop), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "redirects in a loop" in err and len(server.requests) == 2
    _nothing_written(root)


def _cut_then(rest):
    """The first answer: half the file, no Content-Length, then the connection closed; the next
    ones: ``rest``."""

    def answer(handler, n):
        if n == 0:
            handler.send_response(200)
            handler.end_headers()
            handler.wfile.write(BLOB[: len(BLOB) // 2])
            handler.close_connection = True
            return
        rest(handler, n)

    return answer


def _ranges(handler, n):
    start = _range_start(handler)
    handler.send_response(206 if start else 200)
    if start:
        handler.send_header("Content-Range", f"bytes {start}-{len(BLOB) - 1}/{len(BLOB)}")
    handler.end_headers()  # no Content-Length here either: the body ends with the connection
    handler.wfile.write(BLOB[start:])


def test_a_cut_without_content_length_is_resumed_with_a_range_request(serve, tmp_path, capsys):
    server, root = serve(_cut_then(_ranges)), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    assert code == 0, err
    assert server.requests == [("/imagenet-r.tar", None), ("/imagenet-r.tar", f"bytes={len(BLOB) // 2}-")]
    assert (root / "imagenet-r" / "n00000000" / "1.jpg").read_bytes() == b"jpeg"


def test_a_cut_without_content_length_keeps_its_bytes_until_the_server_can_resume(serve, tmp_path, capsys):
    server, root = serve(_cut_then(lambda handler, n: handler.send_error(503))), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    part = root / "archives" / "imagenet-r.tar.part"
    assert "HTTP 503" in err and part.read_bytes() == BLOB[: len(BLOB) // 2]
    assert f"the {len(BLOB) // 2} bytes received are kept" in err
    resumed = serve(_ranges)
    code, err = _run(capsys, root, resumed.url)
    assert code == 0, err
    assert resumed.requests == [("/imagenet-r.tar", f"bytes={len(BLOB) // 2}-")]


def test_a_whole_file_without_content_length_that_fails_its_checksum_is_removed(serve, tmp_path, capsys):
    def wrong(handler, n):
        if _range_start(handler):
            handler.send_error(416)  # nothing after the end: the file was whole
            return
        handler.send_response(200)
        handler.end_headers()
        handler.wfile.write(b"x" * 100)

    server, root = serve(wrong), tmp_path / "data"
    code, err = _run(capsys, root, server.url)
    _one_line(code, err)
    assert "fails its MD5 check" in err and "it was removed" in err and len(server.requests) == 2
    _nothing_written(root)


@pytest.mark.parametrize("form", ["path", "file URL"])
def test_a_local_mirror_folder_is_copied_from_and_left_as_it_is(form, tmp_path, capsys):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "imagenet-r.tar").write_bytes(BLOB)
    root = tmp_path / "data"
    code, err = _run(capsys, root, str(mirror) if form == "path" else mirror.as_uri())
    assert code == 0, err
    assert (mirror / "imagenet-r.tar").read_bytes() == BLOB  # copied, never moved
    assert list((root / "archives").iterdir()) == []  # the copy is removed after extraction


def test_a_local_mirror_problem_is_one_line(tmp_path, capsys):
    mirror = tmp_path / "mirror"
    code, err = _run(capsys, tmp_path / "data", str(mirror))
    _one_line(code, err)
    assert f"the mirror folder {mirror} does not exist" in err
    mirror.mkdir()
    code, err = _run(capsys, tmp_path / "data", str(mirror))
    _one_line(code, err)
    assert "imagenet-r.tar is not in the mirror folder" in err
    (mirror / "imagenet-r.tar").write_bytes(b"damaged")
    code, err = _run(capsys, tmp_path / "data", str(mirror))
    _one_line(code, err)
    assert "fails its MD5 check" in err and "which is left as it is" in err
    assert (mirror / "imagenet-r.tar").read_bytes() == b"damaged"
    _nothing_written(tmp_path / "data")
    code, err = _run(capsys, tmp_path / "data", "ftp://example.org/x")
    _one_line(code, err)
    assert "neither an http(s):// URL nor a local folder" in err


def test_a_users_archive_that_fails_its_checksum_is_left_where_it_is(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "imagenet-r.tar").write_bytes(b"my own, damaged")
    root = tmp_path / "data"
    code = prepare.main(["imagenet_r", "--data-root", str(root), "--archives", str(mine), "--quiet"])
    err = capsys.readouterr().err
    _one_line(code, err)
    assert f"{mine / 'imagenet-r.tar'} fails its MD5 check" in err and "it is left where it is" in err
    assert (mine / "imagenet-r.tar").read_bytes() == b"my own, damaged"
    assert sorted(p.name for p in mine.iterdir()) == ["imagenet-r.tar"]
    # the right file, put there by the user, is used and kept after extraction
    (mine / "imagenet-r.tar").write_bytes(BLOB)
    code = prepare.main(["imagenet_r", "--data-root", str(root), "--archives", str(mine), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert (mine / "imagenet-r.tar").read_bytes() == BLOB and (root / "imagenet-r").is_dir()


@pytest.mark.parametrize("argv", [["--min-rate", "-1"], ["--rate-window", "0"], ["--min-rate", "fast"]])
def test_bad_rate_limits_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        prepare.main(["imagenet_r", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: argument --")
