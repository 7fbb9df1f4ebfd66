"""Downloads that end: verified, resumable, with a deadline, from a server or a local folder.

* Bytes go to ``NAME.part`` and become ``NAME`` only once their checksum matches; a download that
  fails its checksum is removed, a file that was already there (the user's) never is.
* A cut download keeps its bytes; the next attempt asks for the rest with a range request.
* A transfer slower than ``Limits.min_rate`` bytes a second over any ``Limits.window`` seconds
  (headers included) is ended, whatever the server trickles: a socket timeout alone never trips on
  one byte every few seconds. A watchdog thread shuts the socket down, so no read blocks past it.
* Every way a server can misbehave (an HTTP error, a 416 to a request without a range, a
  ``Content-Length`` that is not a number, a redirect loop, a cut, a stall) is one ``NetworkError``
  line that says what was kept and how to go on.
* A mirror is an ``http(s)://`` folder, or a local folder (a path or ``file://``) whose files are
  copied, never moved.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import re
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from benchmarks.core.errors import UserError
from benchmarks.data.unit import Archive  # a dataset unit declares its files as these

TIMEOUT_S = 30  # a connection silent this long fails, whatever the rate limits
MAX_REDIRECTS = 10
_CHUNK = 1 << 20
_MAX_ROUNDS = 5  # range requests after a download that ended without a length and fails its checksum


class NetworkError(UserError):
    """A download that could not reach its server, or that the server did not finish."""


@dataclass(frozen=True)
class Limits:
    """When a download is given up: fewer than ``min_rate`` bytes a second on average over any
    ``window`` seconds since its request (``min_rate`` 0: never), or no byte for ``TIMEOUT_S``."""

    min_rate: float = 1024.0
    window: float = 60.0

    @property
    def socket_timeout(self) -> float:
        return min(TIMEOUT_S, self.window) if self.min_rate > 0 else TIMEOUT_S


def checksum_matches(found: str, expected: str) -> bool:
    """Whether digest ``found`` is ``expected``, or begins with it where ``expected`` gives only the
    first digits (8 or more: open_clip's release files name the first 8 of their SHA-256)."""
    expected = expected.lower()
    return found == expected or (len(expected) >= 8 and found.startswith(expected))


def file_checksum(path: Path, algorithm: str = "md5", progress: bool = False) -> str:
    digest = hashlib.new(algorithm)
    with (
        open(path, "rb") as handle,
        tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=f"checking {path.name}",
            leave=False,
            disable=not progress,
        ) as bar,
    ):
        while block := handle.read(_CHUNK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def by_hand(archive: Archive, destination: Path) -> str:
    return f"download {archive.url} yourself, put it at {destination} and rerun"


def local_mirror(mirror: str | None) -> Path | None:
    """The folder a ``--mirror`` names, if it names a local one (a path or ``file://``); None for an
    http(s) URL or no mirror."""
    if not mirror:
        return None
    parsed = urllib.parse.urlparse(mirror)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme:
        raise UserError(f"--mirror {mirror!r} is neither an http(s):// URL nor a local folder")
    return Path(mirror).expanduser()


def download(
    archive: Archive,
    destination: Path,
    mirror: str | None = None,
    progress: bool = True,
    limits: Limits = Limits(),
) -> Path:
    """Bring ``archive`` to ``destination``, verified. A file already at ``destination`` is checked
    and used, and left where it is if it fails; new bytes go to ``destination.part`` first."""
    if destination.is_file():
        _verify_existing(archive, destination, progress)
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    part = destination.with_name(destination.name + ".part")
    folder = local_mirror(mirror)
    if folder is not None:
        _copy_from_folder(archive, folder, part)
        verified = False
    else:
        verified = _fetch(archive, archive.source(mirror), part, destination, progress, limits)
    if not verified:
        found = file_checksum(part, archive.algorithm, progress)
        if not checksum_matches(found, archive.checksum):
            part.unlink()  # our own download: nothing of the user's
            origin = f" (copied from {folder / archive.filename}, which is left as it is)" if folder else ""
            raise UserError(
                f"the download of {destination.name}{origin} fails its {archive.algorithm.upper()} check "
                f"(expected {archive.checksum}, got {found}); it was removed, rerun to download it again"
            )
    os.replace(part, destination)
    return destination


def _verify_existing(archive: Archive, path: Path, progress: bool) -> None:
    found = file_checksum(path, archive.algorithm, progress)
    if not checksum_matches(found, archive.checksum):
        raise UserError(
            f"{path} fails its {archive.algorithm.upper()} check (expected {archive.checksum}, got "
            f"{found}); it is left where it is: replace it with the official file, or remove it and "
            "rerun to download it"
        )


def _copy_from_folder(archive: Archive, folder: Path, part: Path) -> None:
    source = folder / archive.filename
    if not folder.is_dir():
        raise UserError(f"the mirror folder {folder} does not exist; check --mirror")
    if not source.is_file():
        raise UserError(
            f"{archive.filename} is not in the mirror folder {folder}; put {archive.url} there and rerun"
        )
    shutil.copyfile(source, part)


# --- HTTP -------------------------------------------------------------------------------------------


class RateWatch:
    """Counts a transfer's bytes and, from a thread of its own, shuts its sockets down once fewer
    than ``min_rate * window`` bytes arrived in the last ``window`` seconds: a read blocked on a
    trickling server then returns at once."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.tripped = False
        self._started = time.monotonic()
        self._total = 0
        self._samples: deque[tuple[float, int]] = deque()  # (when, bytes so far)
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RateWatch:
        if self.limits.min_rate > 0:
            self._thread = threading.Thread(target=self._run, name="download rate watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.tripped:
                self._shut(sock)

    def count(self, received: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._total += received
            self._samples.append((now, self._total))
        if self.too_slow(now):
            self.trip()

    def too_slow(self, now: float) -> bool:
        if self.limits.min_rate <= 0 or now - self._started < self.limits.window:
            return False
        start = now - self.limits.window
        with self._lock:
            # keep the last sample at or before the window's start: the total the window began with
            while len(self._samples) > 1 and self._samples[1][0] <= start:
                self._samples.popleft()
            before = self._samples[0][1] if self._samples and self._samples[0][0] <= start else 0
            return self._total - before < self.limits.min_rate * self.limits.window

    def trip(self) -> None:
        with self._lock:
            self.tripped = True
            for sock in self._sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:  # the plain socket's shutdown, under TLS too: the reader sees the end of the stream
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def _run(self) -> None:
        period = min(1.0, self.limits.window / 4)
        while not self._stop.wait(period):
            if self.too_slow(time.monotonic()):
                self.trip()
                return


class _Watched(http.client.HTTPConnection):
    """A connection whose socket the rate watch can close (first in the bases of the HTTP(S)
    connection, so that its ``connect`` wraps theirs)."""

    def __init__(self, *args, watch: RateWatch, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def connect(self) -> None:
        super().connect()
        self._watch.attach(self.sock)


class _WatchedHTTP(_Watched):
    pass


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: RateWatch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req):
        return self.do_open(functools.partial(_WatchedHTTP, watch=self.watch), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: RateWatch) -> None:
        super().__init__()  # no context: http.client's default, as urllib's own handler
        self.watch = watch

    def https_open(self, req):
        return self.do_open(functools.partial(_WatchedHTTPS, watch=self.watch), req, context=self._context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, with a loop or a long chain said in one line (urllib's own message spans
    several)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        chain = getattr(req, "redirect_chain", [req.full_url])
        if newurl in chain or len(chain) > MAX_REDIRECTS:
            fp.close()
            what = "in a loop" if newurl in chain else f"more than {MAX_REDIRECTS} times"
            raise NetworkError(f"{chain[0]} redirects {what} (last to {newurl}); check the URL or --mirror")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.redirect_chain = [*chain, newurl]
        return new


@dataclass(frozen=True)
class _Transfer:
    status: int  # 200, 206, or 416 (a range request past the end: the part is whole)
    sized: bool  # the server said how many bytes, and all came
    received: int


def _fetch(archive: Archive, url: str, part: Path, destination: Path, progress: bool, limits: Limits) -> bool:
    """Download ``url`` into ``part`` (resuming it); True if its checksum was already found right.

    A body without a ``Content-Length`` that ends at a closed connection may be whole or cut: when
    its checksum fails, the rest is asked for with a range request, as a rerun would."""
    for attempt in range(_MAX_ROUNDS):
        transfer = _transfer(archive, url, part, destination, progress, limits)
        if transfer.status == 416 or transfer.sized:
            return False
        if checksum_matches(file_checksum(part, archive.algorithm, progress), archive.checksum):
            return True
        # more may come only after bytes came: a first answer, or a range the server honoured
        if transfer.received == 0 or (transfer.status != 206 and attempt > 0):
            return False
    raise NetworkError(
        f"the download of {url} keeps ending early without saying its length; the "
        f"{part.stat().st_size} bytes received are kept: rerun to resume, or {by_hand(archive, destination)}"
    )


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _content_length(response, url: str) -> int | None:
    value = response.headers.get("Content-Length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise NetworkError(
            f"{url} sent a Content-Length that is not a number ({_one_line(value)[:40]!r}); nothing was "
            "written. Is the URL or --mirror a file server?"
        )
    return int(value)


def _range_start(response) -> int | None:
    found = re.match(r"\s*bytes\s+(\d+)-", response.headers.get("Content-Range", ""))
    return int(found.group(1)) if found else None


def _transfer(
    archive: Archive, url: str, part: Path, destination: Path, progress: bool, limits: Limits
) -> _Transfer:
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "clip-cil-bench"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    received = 0

    def kept() -> str:
        size = part.stat().st_size if part.is_file() else 0
        return f" (the {size} bytes received are kept: a rerun resumes)" if size else ""

    def too_slow() -> NetworkError:
        return NetworkError(
            f"the download of {url} is too slow: under {limits.min_rate:g} bytes/s over {limits.window:g} s "
            f"(--min-rate, --rate-window){kept()}; try later, or {by_hand(archive, destination)}"
        )

    with RateWatch(limits) as watch:
        opener = urllib.request.build_opener(_HTTPHandler(watch), _HTTPSHandler(watch), _Redirects())
        try:
            with opener.open(request, timeout=limits.socket_timeout) as response:
                status = response.status
                if offset and status != 206:  # the server ignored the range: start over
                    offset = 0
                length = _content_length(response, url)
                if status == 206 and _range_start(response) not in (None, offset):
                    raise NetworkError(
                        f"{url} answered the request for bytes {offset}- with another range; "
                        f"{by_hand(archive, destination)}"
                    )
                total = offset + length if length is not None else None
                with (
                    open(part, "ab" if offset else "wb") as out,
                    tqdm(
                        total=total,
                        initial=offset,
                        unit="B",
                        unit_scale=True,
                        desc=destination.name,
                        disable=not progress,
                    ) as bar,
                ):
                    # read1: whatever has arrived, so the rate is checked between small reads too
                    while not watch.tripped and (block := response.read1(_CHUNK)):
                        out.write(block)
                        received += len(block)
                        watch.count(len(block))
                        bar.update(len(block))
        except urllib.error.HTTPError as err:
            if err.code == 416 and offset:  # the range starts at the end: the part is already whole
                return _Transfer(416, True, 0)
            what = "to a request without a range" if err.code == 416 else f"({_one_line(err.reason)[:100]})"
            raise NetworkError(
                f"{url} answered HTTP {err.code} {what}{kept()}; {by_hand(archive, destination)}"
            ) from None
        except (
            urllib.error.URLError,
            http.client.HTTPException,
            TimeoutError,
            ConnectionError,
            ssl.SSLError,
        ) as err:
            if watch.tripped:
                raise too_slow() from None
            reason = _one_line(getattr(err, "reason", None) or err) or type(err).__name__
            raise NetworkError(
                f"cannot download {url}: {reason[:200]}{kept()}; {by_hand(archive, destination)}"
            ) from None
        if watch.tripped:
            raise too_slow()
    if total is not None and offset + received < total:
        raise NetworkError(
            f"the download of {url} stopped at {offset + received} of {total} bytes; rerun to resume it, "
            f"or {by_hand(archive, destination)}"
        )
    return _Transfer(status, total is not None, received)
