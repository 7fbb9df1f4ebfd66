"""``prepare`` on hostile archives: one crafted ``imagenet-r.tar`` per case, whose checksum the test
makes the official one, served from a local mirror folder. Every unsafe member stops the command in
one line that names it, with exit 2, nothing written outside the data root and no staging left;
a setuid file is extracted without the bit. Each case runs through tarfile's ``data`` filter and
through the suite's own checks for a Python without it."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks.data.unit import dataset_unit
from benchmarks.data.units.imagenet_r import IMAGENET_R
from benchmarks.prepare import command as prepare
from benchmarks.prepare import safe_extract as extraction

WNIDS = [f"n{i:08d}" for i in range(200)]  # the state check counts 200 wnid folders


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, len(data), fields.pop("mode", 0o644)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _tar(members: list[tuple]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, body in [_member("imagenet-r", tarfile.DIRTYPE, mode=0o755), *members]:
            archive.addfile(info, body)
    return buffer.getvalue()


def _dataset(*extra: tuple) -> list[tuple]:
    folders = [_member(f"imagenet-r/{w}", tarfile.DIRTYPE, mode=0o755) for w in WNIDS]
    return [*folders, _member(f"imagenet-r/{WNIDS[0]}/1.jpg", data=b"jpeg"), *extra]


def _cases(outside: Path) -> dict[str, tuple[str, list[tuple]]]:
    """case -> (the member refused, the archive's members); ``outside`` holds ``secret.txt``."""
    pwned = b"written by the archive"
    absolute = str(outside / "absolute.txt")
    return {
        "dot-dot": ("../../escaped.txt", _dataset(_member("../../escaped.txt", data=pwned))),
        "absolute path": (absolute, _dataset(_member(absolute, data=pwned))),
        "write through a symlink": (
            "imagenet-r/out",
            _dataset(
                _member("imagenet-r/out", tarfile.SYMTYPE, linkname="../../outside"),
                _member("imagenet-r/out/through.txt", data=pwned),
            ),
        ),
        "symlink chain": (  # each link inside on paper; x/.. leaves through x on disk
            "y",
            _dataset(
                _member("x", tarfile.SYMTYPE, linkname="."),
                _member("y", tarfile.SYMTYPE, linkname="x/.."),
                _member("y/outside/chained.txt", data=pwned),
            ),
        ),
        "hard link to an outside file": (
            "imagenet-r/secret",
            _dataset(
                _member("imagenet-r/secret", tarfile.LNKTYPE, linkname="../outside/secret.txt"),
                _member("imagenet-r/secret", data=pwned),  # would write into the linked file
            ),
        ),
        "symlink to /etc": (
            "imagenet-r/etc",
            _dataset(_member("imagenet-r/etc", tarfile.SYMTYPE, linkname="/etc")),
        ),
        "device file": (
            "imagenet-r/null",
            _dataset(_member("imagenet-r/null", tarfile.CHRTYPE, devmajor=1, devminor=3)),
        ),
        "fifo": ("imagenet-r/pipe", _dataset(_member("imagenet-r/pipe", tarfile.FIFOTYPE))),
    }


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` but the data root and the mirror, with a file's bytes."""
    skip = {folder / "data", folder / "mirror"}
    return {
        str(p): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
        for p in folder.rglob("*")
        if not skip & {p, *p.parents}
    }


@pytest.fixture(params=["data filter", "own checks"])
def filtered(request, monkeypatch):
    """Both paths: the standard library's filter (where this Python has it) and the fallback."""
    if request.param == "data filter" and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    monkeypatch.setattr(extraction, "has_data_filter", lambda: request.param == "data filter")
    return request.param


def _prepare(tmp_path: Path, monkeypatch, capsys, blob: bytes) -> tuple[int, str, Path]:
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / "imagenet-r.tar").write_bytes(blob)
    checksum = hashlib.md5(blob).hexdigest()
    archive = prepare.Archive(IMAGENET_R.url, checksum)
    monkeypatch.setattr(dataset_unit("imagenet_r"), "archives", lambda: [archive])
    root = tmp_path / "data"
    code = prepare.main(["imagenet_r", "--data-root", str(root), "--mirror", str(mirror), "--quiet"])
    return code, capsys.readouterr().err, root


@pytest.mark.parametrize("case", list(_cases(Path("/x"))))
def test_an_unsafe_member_is_refused_in_one_line_and_nothing_escapes(
    case, filtered, tmp_path, monkeypatch, capsys
):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"the user's")
    member, members = _cases(outside)[case]
    before = _snapshot(tmp_path)
    code, err, root = _prepare(tmp_path, monkeypatch, capsys, _tar(members))
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert f"refused to extract member {member!r}" in err
    assert _snapshot(tmp_path) == before  # nothing written, changed or linked outside the root
    assert (outside / "secret.txt").read_bytes() == b"the user's"
    assert not (root / "imagenet-r").exists() and not list(root.glob(".prepare-*"))


def test_setuid_setgid_and_sticky_bits_are_dropped(filtered, tmp_path, monkeypatch, capsys):
    blob = _tar(
        _dataset(
            _member(f"imagenet-r/{WNIDS[0]}/tool", data=b"#!/bin/sh\n", mode=0o6755),
            _member(f"imagenet-r/{WNIDS[0]}/shared", tarfile.DIRTYPE, mode=0o3777),
        )
    )
    code, err, root = _prepare(tmp_path, monkeypatch, capsys, blob)
    assert code == 0, err
    folder = root / "imagenet-r" / WNIDS[0]
    tool, shared = (folder / "tool").stat().st_mode, (folder / "shared").stat().st_mode
    assert not tool & (stat.S_ISUID | stat.S_ISGID) and tool & 0o700 == 0o700
    assert not shared & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH)


def test_safe_links_inside_the_folder_are_extracted(filtered, tmp_path, monkeypatch, capsys):
    first = f"{WNIDS[0]}/1.jpg"
    blob = _tar(
        _dataset(
            _member(f"imagenet-r/{WNIDS[1]}/same.jpg", tarfile.SYMTYPE, linkname=f"../{first}"),
            _member(
                f"imagenet-r/{WNIDS[2]}/hard.jpg", tarfile.LNKTYPE, linkname=f"imagenet-r/{WNIDS[0]}/1.jpg"
            ),
        )
    )
    code, err, root = _prepare(tmp_path, monkeypatch, capsys, blob)
    assert code == 0, err
    assert (root / "imagenet-r" / WNIDS[1] / "same.jpg").read_bytes() == b"jpeg"
    assert (root / "imagenet-r" / WNIDS[2] / "hard.jpg").read_bytes() == b"jpeg"


def _zip(name: str, mode: int = 0o100644) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        bundle.writestr(info, b"x")
    return buffer


@pytest.mark.parametrize(
    "name, mode, why",
    [
        ("../../escaped.txt", 0o100644, "a '..' in its path"),
        ("/abs.txt", 0o100644, "an absolute path"),
        ("link", stat.S_IFLNK | 0o777, "not a plain file"),
        ("pipe", stat.S_IFIFO | 0o644, "not a plain file"),
    ],
)
def test_a_zip_member_that_is_unsafe_is_refused(name, mode, why, tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(_zip(name, mode).getvalue())
    into = tmp_path / "a" / "b" / "into"
    with pytest.raises(extraction.UnsafeArchiveError, match=why) as refused:
        extraction.extract(archive, into)
    assert refused.value.member == name and "\n" not in str(refused.value)
    assert list(into.iterdir()) == [] and not (tmp_path / "a" / "escaped.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["a", "a.zip"]


def test_a_file_that_is_no_archive_is_one_line(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"not an archive")
    with pytest.raises(prepare.UserError, match="neither a tar nor a zip"):
        extraction.extract(tmp_path / "x.tar", tmp_path / "into")


def test_torchvisions_imagenet_parsers_extract_through_the_same_checks(tmp_path, monkeypatch, capsys):
    """The ILSVRC2012 devkit is extracted by torchvision's parser (into a temporary folder, put under
    tmp_path here): a hostile member is refused there too, and the user's archives stay."""
    import tempfile

    from torchvision.datasets import imagenet as tv_imagenet

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.addfile(*_member("../../escaped.txt", data=b"written by the archive"))
    archives = tmp_path / "ilsvrc"
    archives.mkdir()
    blobs = {"devkit": buffer.getvalue(), "val": b"val", "train": b"train"}
    meta = {}
    for part, (name, _) in tv_imagenet.ARCHIVE_META.items():
        (archives / name).write_bytes(blobs[part])
        meta[part] = (name, hashlib.md5(blobs[part]).hexdigest())
    monkeypatch.setattr(tv_imagenet, "ARCHIVE_META", meta)
    root = tmp_path / "data"
    code = prepare.main(["imagenet", "--data-root", str(root), "--archives", str(archives), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "refused to extract member '../../escaped.txt'" in err
    assert not list(tmp_path.rglob("escaped.txt")) and not list(root.glob(".prepare-*"))
    assert sorted(p.name for p in archives.iterdir()) == sorted(name for name, _ in meta.values())
