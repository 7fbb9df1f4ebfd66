"""Extraction that cannot escape its folder.

An archive that passes its checksum is still only as safe as whoever made it (a mirror, a copy put
in by hand), so every member is checked just before it is written, with what is already on disk
(symlinks extracted earlier) taken into account. Refused, and the whole extraction stopped: an
absolute path, a ``..`` in a path, a path that leaves the folder through a symlink, a symlink or hard link
whose target leaves the folder, a device file and a FIFO. Kept, but without their setuid, setgid
and sticky bits (and group/other write): everything else.

Tar archives go through the standard library's ``data`` filter where the running Python has it
(3.11.4+, 3.12+); elsewhere the same rules are checked here (``_checked_member``). Zip archives
cannot hold links or special files that ``zipfile`` would create, but their names are checked too.
"""

from __future__ import annotations

import copy
import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.core.errors import UserError


class UnsafeArchiveError(UserError):
    """A member that would be written outside its folder, or is not a plain file, folder or link."""

    def __init__(self, archive: Path, member: str, why: str) -> None:
        super().__init__(
            f"{Path(archive).name}: refused to extract member {member!r}: {why}; nothing was installed "
            "(is the archive the official one?)"
        )
        self.member = member


def has_data_filter() -> bool:
    """Whether this Python's ``tarfile`` has the ``data`` extraction filter (tests turn it off)."""
    return hasattr(tarfile, "data_filter")


# the data filter's refusals, said in the words of the fallback's
_FILTER_REASONS = {
    "AbsolutePathError": "an absolute path",
    "OutsideDestinationError": "it would be written outside the folder",
    "SpecialFileError": "a device file or FIFO",
    "AbsoluteLinkError": "a link to an absolute path",
    "LinkOutsideDestinationError": "a link whose target leaves the folder",
}


def extract(archive: Path, into: Path) -> None:
    """Extract the tar or zip file ``archive`` into the folder ``into`` (created), member by member;
    the first unsafe member stops it with ``UnsafeArchiveError`` (what came before stays in ``into``:
    extract into a staging folder)."""
    archive, into = Path(archive), Path(into)
    into.mkdir(parents=True, exist_ok=True)
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            if has_data_filter():
                _extract_tar_filtered(tar, archive, into)
            else:
                _extract_tar_checked(tar, archive, into)
    elif zipfile.is_zipfile(archive):
        _extract_zip(archive, into)
    else:
        raise UserError(f"{archive.name} is neither a tar nor a zip archive; is it the official file?")


def _check_name(name: str, archive: Path) -> None:
    """Refuse an absolute name (the data filter would strip its ``/`` and extract it) and any ``..``
    component, even one that stays inside: no official archive has one."""
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(archive, name, "an absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise UnsafeArchiveError(archive, name, "a '..' in its path")


def _extract_tar_filtered(tar: tarfile.TarFile, archive: Path, into: Path) -> None:
    def data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        _check_name(member.name, archive)
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as err:
            why = _FILTER_REASONS.get(type(err).__name__, str(err))
            raise UnsafeArchiveError(archive, member.name, why) from None

    tar.extractall(into, filter=data_filter)


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _checked_member(member: tarfile.TarInfo, dest: str, archive: Path) -> tarfile.TarInfo:
    """The rules of the ``data`` filter, for a Python without it: ``member`` (a copy, with a safe
    mode) if it may be extracted into ``dest`` (a real path), else ``UnsafeArchiveError``."""
    name = member.name
    _check_name(name, archive)
    # realpath follows the symlinks already extracted: a file written through one is caught here
    if not _inside(os.path.realpath(os.path.join(dest, name)), dest):
        raise UnsafeArchiveError(archive, name, "it would be written outside the folder")
    if (
        member.ischr()
        or member.isblk()
        or member.isfifo()
        or not (member.isreg() or member.isdir() or member.issym() or member.islnk())
    ):
        raise UnsafeArchiveError(archive, name, "a device file or FIFO")
    if member.issym() or member.islnk():
        if os.path.isabs(member.linkname):
            raise UnsafeArchiveError(archive, name, "a link to an absolute path")
        # a symlink's target is relative to its own folder, a hard link's to the archive's root
        base = os.path.dirname(os.path.join(dest, name)) if member.issym() else dest
        if not _inside(os.path.realpath(os.path.join(base, member.linkname)), dest):
            raise UnsafeArchiveError(archive, name, "a link whose target leaves the folder")
    safe = copy.copy(member)
    # no setuid, setgid or sticky bit, no group/other write; the owner may always read and write
    safe.mode = (member.mode & 0o755) | (0o700 if member.isdir() else 0o600)
    return safe


def _extract_tar_checked(tar: tarfile.TarFile, archive: Path, into: Path) -> None:
    dest = os.path.realpath(into)
    # this Python may still know the filter argument (only the data filter was looked for): the
    # checks above are then the only ones, as on a Python without filters
    trusted: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    directories = []
    for member in tar:
        safe = _checked_member(member, dest, archive)
        # attributes set here, not by tarfile: no chown (as root), and a folder's mode only at the
        # end, since a read-only folder would refuse its own members
        tar.extract(safe, dest, set_attrs=False, **trusted)
        target = os.path.join(dest, safe.name)
        if safe.isdir():
            directories.append((target, safe.mode))
        elif safe.isreg():
            os.chmod(target, safe.mode)
            os.utime(target, (safe.mtime, safe.mtime))
    for target, mode in reversed(directories):
        os.chmod(target, mode)


def _extract_zip(archive: Path, into: Path) -> None:
    dest = os.path.realpath(into)
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            name = info.filename
            kind = stat.S_IFMT(info.external_attr >> 16)
            _check_name(name, archive)
            if not _inside(os.path.realpath(os.path.join(dest, name)), dest):
                raise UnsafeArchiveError(archive, name, "it would be written outside the folder")
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):  # a symlink, device or FIFO entry
                raise UnsafeArchiveError(archive, name, "not a plain file or folder")
            bundle.extract(info, dest)  # zipfile sets no mode bits: setuid cannot survive
