"""Prepare data and weights: ``python -m benchmarks.prepare cifar100 weights --data-root /data``.

The only command of the suite that downloads. Each target ends in the layout its loader reads or,
for the weights, in the cache the backbone loader looks in (``benchmarks.backbone.weights``). The
dataset targets are the dataset units' (``benchmarks/data/units/``): each unit holds its files,
their checksums and its steps; this command runs them safely:

* ``cifar100``, ``pets``, ``food101``: torchvision's archives, URLs and MD5 checksums;
* ``imagenet_r``: the official ``imagenet-r.tar``;
* ``imagenet``: the user's ILSVRC2012 archives (a login is needed to download them), parsed by
  torchvision's ImageNet functions into ``imagenet/{train,val}/<wnid>/``, val sorted by the devkit
  (``imagenet100`` and ``imagenet1k`` name it too: both read that folder);
* the field's datasets (``cub200``, ``aircraft``, ``tinyimagenet``, ``imagenet_a``, ``sun397``: their
  official archives; ``cars196``: the user's official files; ``objectnet``, ``ucf101`` and the LAMDA
  family's folders: by hand, said in one line): docs/adding-a-dataset.md, "The datasets";
* ``weights``: the openai ViT-B-16 checkpoint through open_clip's own download (Hugging Face hub);
  ``weights:MODEL/TAG`` any other weights open_clip's registry lists (``weights:ViT-B-16/laion400m_e32``;
  ``benchmarks.prepare.weights``);
* ``all``: every target above (one whose files only the user can get, such as ``imagenet``, only
  when they are there; of the weights, the default only).

What a crash leaves: a download goes to ``NAME.part`` and resumes on a rerun (an HTTP range
request); its checksum is verified before anything is extracted; an archive is extracted into a
hidden staging folder, member by member through ``safe_extract`` (nothing lands outside it), and
renamed into place whole. A rerun skips what is already prepared. ``--list`` shows each target's
state (of the weights: the default, and every tag a suite names). ``--mirror`` (or
``CIL_BENCH_MIRROR``) fetches every file by name from a plain HTTP folder or a local folder instead
of its official host (a cluster's mirror), with the same checksums.

What it never does: hang on a slow server (``fetch``: ``--min-rate`` over ``--rate-window``),
run twice at once on one target (``lock``: the second waits, or with ``--no-wait`` stops), or
delete a file it did not download (a user's archive that fails its checksum is left where it is).
Mistakes and a missing network print one line each (every target is tried, so one run names all
that is missing) and exit with 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.backbone.weights import BackboneSpec
from benchmarks.core.errors import STORAGE_ERRORS, CommandParser, UserError, one_line_user_errors
from benchmarks.core.heartbeat_lock import read_holder
from benchmarks.data.unit import DatasetUnit, file_targets, target_of
from benchmarks.prepare.fetch import Archive, Limits, download, file_checksum, local_mirror
from benchmarks.prepare.lock import describe, lock_path, target_lock
from benchmarks.prepare.safe_extract import extract
from benchmarks.prepare.weights import Weights, parse_weights_target, suite_weights, tag_weights

MIRROR_ENV = "CIL_BENCH_MIRROR"


# --- staging and installing ------------------------------------------------------------------------


class Staging:
    """A hidden folder beside the final one, removed on exit whatever happens; ``install`` renames
    what was built in it into place whole, so a reader never sees half a dataset."""

    def __init__(self, root: Path, target: str) -> None:
        self.path = root / f".prepare-{target}"

    def __enter__(self) -> Path:
        shutil.rmtree(self.path, ignore_errors=True)  # what a killed earlier attempt left
        self.path.mkdir(parents=True)
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


#: the split folders a paper's authors' archive holds (the LAMDA family's ``train/`` and ``test/`` or
#: ``val/``), which may share a dataset's folder with its official files
AUTHORS_SPLIT_FOLDERS = ("train", "test", "val")


def install(built: Path, final: Path, force: bool = False) -> None:
    """Move ``built`` to ``final``; an existing ``final`` is replaced only with ``force``, and never
    when it holds split folders the built one lacks (an authors' archive the user extracted there,
    which no download brings back)."""
    if final.exists():
        if not force:
            raise UserError(f"{final} exists but is incomplete or damaged; remove it, or rerun with --force")
        theirs = [n for n in AUTHORS_SPLIT_FOLDERS if (final / n).is_dir() and not (built / n).is_dir()]
        if theirs:
            raise UserError(
                f"{final} holds {'/, '.join(theirs)}/ folders (an authors' split the official files do not "
                "bring back); --force will not replace them: move them elsewhere first, or leave the target"
            )
        trash = final.with_name(f".{final.name}.replaced")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
        os.replace(built, final)
        shutil.rmtree(trash, ignore_errors=True)
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(built, final)


# --- targets ----------------------------------------------------------------------------------------


@dataclass
class Context:
    data_root: Path
    archives: Path  # where downloads go and where the ILSVRC archives are looked for
    mirror: str | None = None
    force: bool = False
    progress: bool = True
    keep_archives: bool = False
    limits: Limits = field(default_factory=Limits)

    # The safe steps a dataset unit's ``prepare`` runs (``benchmarks.data.unit.PrepareContext``).
    def download_and_install(
        self, target: str, archives: list[Archive], top: str, into_top: bool = False
    ) -> None:
        _download_and_install(self, target, archives, top, into_top)

    def staging(self, target: str) -> Staging:
        return Staging(self.data_root, target)

    def install(self, built: Path, final: Path) -> None:
        install(built, final, self.force)

    def extract(self, archive: Path, into: Path) -> None:
        extract(archive, into)

    def checksum(self, path: Path, algorithm: str = "md5") -> str:
        return file_checksum(path, algorithm)


@dataclass(frozen=True)
class Target:
    """A preparable thing: ``state`` (present, missing, or corrupt: <why>), ``where`` it ends up,
    and ``prepare``, which makes it present."""

    name: str
    help: str
    where: Callable[[Context], Path]
    state: Callable[[Context], str]
    prepare: Callable[[Context], None]
    archives: Callable[[], list[Archive]] = field(default=list)
    #: why ``all`` skips it although missing (files only the user can get), or None
    unavailable: Callable[[Context], str | None] = lambda ctx: None
    #: where its lock lives (None: beside what it installs)
    lock_folder: Callable[[], Path] | None = None


def _download_and_install(
    ctx: Context, name: str, archives: list[Archive], top: str, into_top: bool = False
) -> None:
    """Download ``archives`` (verified), extract them all into staging (into ``top/`` itself when
    the archives hold its subfolders, as Pets' do), then install ``top``. Only the archives this
    command downloaded are removed afterwards: one that was there already may be the user's."""
    theirs = {a.filename for a in archives if (ctx.archives / a.filename).is_file()}
    paths = [download(a, ctx.archives / a.filename, ctx.mirror, ctx.progress, ctx.limits) for a in archives]
    with Staging(ctx.data_root, name) as staging:
        for path in paths:
            extract(path, staging / top if into_top else staging)
        built = staging / top
        if built.is_symlink() or not built.is_dir():
            raise UserError(f"{paths[0].name} does not hold a {top}/ folder; is it the official archive?")
        install(built, ctx.data_root / top, ctx.force)
    if not ctx.keep_archives:
        for path in paths:
            if path.name not in theirs:
                path.unlink(missing_ok=True)


def _weights_target(weights: Weights) -> Target:
    """A model's weights by open_clip tag (``benchmarks.prepare.weights``), locked in the loader's cache."""
    return Target(
        weights.name,
        weights.help,
        lambda ctx: weights.file(),
        weights.state,
        weights.prepare,
        lambda: [a for a in [weights.archive()] if a is not None],
        lock_folder=lambda: Weights().file().parent,
    )


def _dataset_target(unit: DatasetUnit) -> Target:
    """The target of a dataset unit's files: its own steps, run by this command."""
    target, folder = unit.target, unit.folder
    assert target is not None and folder is not None  # file_targets() holds units with files only
    return Target(
        target,
        unit.describe_files(),
        lambda ctx: ctx.data_root / folder,
        unit.state,
        unit.prepare,
        lambda: unit.archives(),
        unit.unavailable,
    )


def targets(weights: list[Weights] | None = None) -> dict[str, Target]:
    """Every dataset target of the registered units, in their listing order, then the weights
    (``weights``; None: the default ones only)."""
    table = {name: _dataset_target(unit) for name, unit in file_targets().items()}
    for each in weights or [Weights()]:
        table[each.name] = _weights_target(each)
    return table


def readiness(datasets: Iterable[str], backbones: Iterable[BackboneSpec], data_root: str) -> list[str]:
    """A line for each file target the ``datasets`` read and each of the ``backbones``' weights:
    present, or missing (or corrupt) with the command that brings it; ``--dry-run``'s lines. The
    synthetic world, random weights and the tiny CLIP's shipped ones need nothing."""
    ctx = Context(Path(data_root).expanduser(), Path(data_root).expanduser() / "archives")
    lines = []
    for name in dict.fromkeys(t for dataset in datasets if (t := target_of(dataset)) is not None):
        target = _dataset_target(file_targets()[name])
        lines.append(
            _ready_line(
                f"data {name}", target.state(ctx), target.where(ctx), f"{name} --data-root {data_root}"
            )
        )
    for backbone in dict.fromkeys(backbones):
        if (weights := tag_weights(backbone.model, backbone.pretrained)) is None:
            continue  # random, a file of the user's (checked by the run), or the tiny CLIP's own
        lines.append(
            _ready_line(
                f"weights {weights.model}/{weights.tag}", weights.state(), weights.file(), weights.name
            )
        )
    return lines


def _ready_line(what: str, state: str, where: Path, prepare_args: str) -> str:
    if state == "present":
        return f"{what}: present ({where})"
    return f"{what}: {state}; python -m benchmarks.prepare {prepare_args}"


# --- the command ------------------------------------------------------------------------------------


def _list(ctx: Context) -> str:
    lines = ["| target | state | where |", "|---|---|---|"]
    for target in targets(suite_weights()).values():
        state = target.state(ctx)
        for archive in target.archives():
            part = ctx.archives / (archive.filename + ".part")
            if state == "missing" and part.is_file():
                state = (
                    f"missing ({part.stat().st_size} bytes of {archive.filename} downloaded: rerun to resume)"
                )
        holder = read_holder(lock_path(_lock_folder(target, ctx), target.name))
        if holder is not None:
            state += f" (being prepared by {describe(holder)})"
        lines.append(f"| {target.name} | {state} | {target.where(ctx)} |")
    return "\n".join(lines)


def _number(low: float, strict: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value != value or value < low or (strict and value == low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'above' if strict else 'at least'} {low:g}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = list(targets())
    parser = CommandParser(
        prog="python -m benchmarks.prepare",
        description=__doc__.split("\n")[0],
        epilog="targets: "
        + "; ".join(f"{t.name}: {t.help}" for t in targets().values())
        + "; weights:MODEL/TAG: any weights open_clip lists (e.g. weights:ViT-B-16/laion400m_e32)"
        + "; all: every one",
    )
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help=f"{', '.join(names)}, weights:MODEL/TAG or all (or the name of a dataset: the target it reads)",
    )
    parser.add_argument("--data-root", default="data", help="where the datasets go (default: ./data)")
    parser.add_argument(
        "--archives",
        help="where archives are downloaded to, and the ILSVRC2012 archives are looked for "
        "(default: DATA_ROOT/archives)",
    )
    parser.add_argument(
        "--mirror",
        default=os.environ.get(MIRROR_ENV),
        help=f"an http(s):// folder, or a local folder, holding every file by name (default: ${MIRROR_ENV})",
    )
    parser.add_argument("--list", action="store_true", help="show what is present, missing or corrupt")
    parser.add_argument(
        "--force", action="store_true", help="prepare again a target that is present or damaged"
    )
    parser.add_argument(
        "--keep-archives", action="store_true", help="keep downloaded archives after extraction"
    )
    parser.add_argument(
        "--min-rate",
        type=_number(0),
        default=Limits.min_rate,
        metavar="BYTES_PER_S",
        help="give up a download that averages fewer bytes a second than this over any --rate-window "
        f"(default: {Limits.min_rate:g}; 0: never)",
    )
    parser.add_argument(
        "--rate-window",
        type=_number(0, strict=True),
        default=Limits.window,
        metavar="SECONDS",
        help=f"the window --min-rate is measured over (default: {Limits.window:g})",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="stop in one line if another command is preparing the same target, instead of waiting",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    # a dataset's name means the target of the files it reads (imagenet100: imagenet)
    wanted = names if "all" in args.targets else [target_of(t) or t for t in args.targets]
    # weights:MODEL/TAG, checked against open_clip's registry (weights:<the default> is weights)
    tagged = {t: Weights(*pair) for t in wanted if (pair := parse_weights_target(t)) is not None}
    wanted = [tagged[t].name if t in tagged else t for t in wanted]
    unknown = [t for t in wanted if t not in names and not t.startswith("weights")]
    if unknown:
        parser.error(
            f"unknown target {unknown[0]!r}; valid: {', '.join(names)}, all "
            "(and weights:MODEL/TAG, any weights open_clip lists)"
        )
    if not wanted and not args.list:
        parser.error("name at least one target, or --list")
    args.targets = list(dict.fromkeys(wanted))
    args.weights = list(dict.fromkeys([Weights(), *tagged.values()]))
    args.all = "all" in args.targets or set(args.targets) == set(names)
    return args


def _lock_folder(target: Target, ctx: Context) -> Path:
    """Where ``target``'s lock lives: beside what it installs (the data root), the weights' in
    open_clip's cache folder."""
    return target.lock_folder() if target.lock_folder else target.where(ctx).parent


def _prepare_one(target: Target, ctx: Context, args: argparse.Namespace) -> None:
    """Prepare ``target`` under its lock: its state is read again, since the command that held the
    lock before may have prepared it meanwhile."""
    name, state = target.name, target.state(ctx)
    if state == "present" and not args.force:
        print(f"{name}: already prepared at {target.where(ctx)}", file=sys.stderr)
        return
    if args.all and state == "missing" and (why := target.unavailable(ctx)) is not None:
        print(f"{name}: skipped, {why}", file=sys.stderr)
        return
    if state.startswith("corrupt") and not args.force:
        raise UserError(f"{name} at {target.where(ctx)} is {state}; rerun with --force to replace it")
    target.prepare(ctx)
    after = target.state(ctx)
    if after != "present":
        raise UserError(
            f"{name}: prepared, but {target.where(ctx)} is {after}; is the archive the official one?"
        )
    print(f"{name}: ready at {target.where(ctx)}", file=sys.stderr)


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(args.data_root).expanduser()
    ctx = Context(
        data_root=root,
        archives=Path(args.archives).expanduser() if args.archives else root / "archives",
        mirror=args.mirror or None,
        force=args.force,
        progress=not args.quiet,
        keep_archives=args.keep_archives,
        limits=Limits(args.min_rate, args.rate_window),
    )
    folder = local_mirror(ctx.mirror)
    if folder is not None and not folder.is_dir():
        raise UserError(f"the mirror folder {folder} does not exist; check --mirror or ${MIRROR_ENV}")
    if args.list:
        print(_list(ctx))
        return 0
    table = targets(args.weights)
    failed = []  # every target is tried: an offline user learns all that is missing at once
    try:
        for name in args.targets:
            target = table[name]
            if target.state(ctx) == "present" and not args.force:  # installed whole: no lock needed
                print(f"{name}: already prepared at {target.where(ctx)}", file=sys.stderr)
                continue
            try:
                with target_lock(_lock_folder(target, ctx), name, wait=not args.no_wait):
                    _prepare_one(target, ctx, args)
            except UserError as err:
                print(f"error: {err}", file=sys.stderr)
                failed.append(name)
    except KeyboardInterrupt:
        print("interrupted: rerun the same command; a partial download resumes", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in STORAGE_ERRORS:  # a full disk, a folder one may not write
            raise
        where = f" ({err.filename})" if err.filename else ""
        raise UserError(
            f"cannot write{where}: {err.strerror}; free space or fix permissions, then rerun"
        ) from None
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
