"""Fake data in the real formats: ``python -m benchmarks.tools.fake_data --data-root DIR``.

Every real dataset in the layout its loader reads, written by its dataset unit
(``DatasetUnit.write_fake``, ``benchmarks/data/units/``) with the real class lists and a few random
images a class, and a randomly initialised ``ViT-B-16-quickgelu`` weight file. With them,
``--fast-dev-run`` walks every real suite on a machine without the data or the weights
(``docs/running.md``). The root is marked with ``FAKE_DATA.json``: checksums are not checked there
and every result computed on it says ``config.fake_data``. So it writes only into a new folder or
one it made: a root that holds any real dataset (a dataset unit's folder the marker does not list as
its own, or ``prepare``'s archives) is refused, and left as it was.

Class lists: CIFAR-100's 100 fine labels, Food-101's 101 dishes and the 37 Oxford-IIIT Pets breeds
as their official metadata lists them; ImageNet's 1000 wnids (``assets/imagenet_wnids.json``);
ImageNet-R's 200 (``assets/imagenet_r_wnids.json``: the 200 indices into the sorted 1000 that
github.com/hendrycks/imagenet-r ``eval.py`` lists), its files named as the shipped RAPF split lists
them (``assets/imagenet_r_split_rapf.txt``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from benchmarks.core.atomic_io import write_json
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.data.datasets import FAKE_DATA_MARKER
from benchmarks.data.unit import DatasetUnit, file_targets, target_of


def fake_targets() -> dict[str, DatasetUnit]:
    """The targets whose dataset units write fake data, in listing order (cifar100, imagenet_r,
    imagenet, pets, food101, then any other unit's)."""
    return {name: unit for name, unit in file_targets().items() if unit.writes_fake}


def dataset_folders() -> dict[str, str]:
    """The folder each fake-data target's loader reads under the data root (its unit's ``folder``)."""
    return {name: unit.disk_folder for name, unit in fake_targets().items()}


#: what ``python -m benchmarks.prepare`` leaves beside real data: its downloads and its staging folders
PREPARE_TRACES = ("archives", ".prepare-*")
WEIGHTS_FILE = "ViT-B-16-quickgelu-random.safetensors"
#: the marker's ``generator``: the folders of a marker this tool did not write are not its own
GENERATOR = "benchmarks.tools.fake_data"


def write_random_weights(path: Path, seed: int = 0, model: str = "ViT-B-16-quickgelu") -> Path:
    """A randomly initialised open_clip ``model`` as safetensors (fp16, as OpenAI ships its weights)."""
    import open_clip
    import torch

    from benchmarks.backbone.loading import quiet_root_logger
    from benchmarks.core.atomic_io import write_tensors

    torch.manual_seed(seed)
    with quiet_root_logger():  # open_clip warns that a random init is random
        clip = open_clip.create_model(model, pretrained=None)
    write_tensors(path, {k: v.detach().half().contiguous() for k, v in clip.state_dict().items()})
    return path


def _own_folders(root: Path) -> set[str]:
    """The dataset folders that ``root``'s marker lists as written (or being written) by this tool;
    none where there is no marker, or one this tool did not write."""
    try:
        record = json.loads((root / FAKE_DATA_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(record, dict) or record.get("generator") != GENERATOR:
        return set()
    listed = record.get("datasets")
    return {str(folder) for folder in listed.values()} if isinstance(listed, dict) else set()


def real_data_in(root: Path) -> list[str]:
    """What under ``root`` is not fake data of this tool: every dataset folder it can write that the
    marker does not list as its own, whichever datasets are asked for now, and ``prepare``'s traces."""
    own = _own_folders(root)
    # every unit's folder, whether or not it writes fake data: any real dataset is refused
    folders = dict.fromkeys(unit.disk_folder for unit in file_targets().values())
    found = [f"{folder}/" for folder in folders if (root / folder).exists() and folder not in own]
    for pattern in PREPARE_TRACES:
        found += sorted(f"{path.name}/" for path in root.glob(pattern))
    return found


def make_fake_data(
    root: Path,
    datasets: tuple[str, ...] | None = None,
    train_per_class: int = 2,
    test_per_class: int = 1,
    seed: int = 0,
    weights: bool = True,
) -> dict:
    """Write the fake datasets (targets; None: all) and weights under ``root``; returns what
    ``FAKE_DATA.json`` records. A root that holds real data (``real_data_in``) is refused with a
    ``UserError`` before anything is written."""
    if real := real_data_in(root):  # checked before anything is written: a refusal changes nothing
        raise UserError(
            f"{root} holds real data ({', '.join(real)}), and its checksums would go unchecked beside "
            f"fake data marked {FAKE_DATA_MARKER}; choose another --data-root (a new folder)"
        )
    units = fake_targets()
    folders = dataset_folders()
    datasets = tuple(units) if datasets is None else datasets
    rng = np.random.RandomState(seed)
    root.mkdir(parents=True, exist_ok=True)
    # Written first, listing what is about to be written besides what an earlier call wrote: a killed
    # generation leaves a folder that a rerun recognises as its own and completes.
    earlier = {name: folder for name, folder in folders.items() if folder in _own_folders(root)}
    planned = {**earlier, **{name: folders[name] for name in datasets}}
    record = {"generator": GENERATOR, "seed": seed, "datasets": planned}
    write_json(root / FAKE_DATA_MARKER, record)
    for name in tqdm(datasets, desc="fake data"):
        units[name].write_fake(root, train_per_class, test_per_class, rng)
    record.update(train_per_class=train_per_class, test_per_class=test_per_class)
    if weights:
        record["weights"] = str(write_random_weights(root / WEIGHTS_FILE, seed))
    write_json(root / FAKE_DATA_MARKER, record)
    return record


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.fake_data", description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", required=True, help="where to write (a new or a fake-data folder)")
    names = list(fake_targets())
    parser.add_argument(
        "--datasets",
        default=",".join(names),
        help=f"comma-separated subset of {', '.join(names)} (or names of datasets that read them)",
    )
    parser.add_argument("--train-per-class", type=int, default=2)
    parser.add_argument("--test-per-class", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-weights", action="store_true", help="skip the random ViT-B/16 weight file")
    args = parser.parse_args(argv)
    asked = [d for d in args.datasets.split(",") if d]
    # a dataset's name means the target of the files it reads (imagenet100: imagenet)
    datasets = tuple(dict.fromkeys(target if (target := target_of(d)) in names else d for d in asked))
    unknown = sorted(set(datasets) - set(names))
    if unknown:
        raise UserError(f"unknown dataset {unknown[0]!r}; valid: {', '.join(names)}")
    if not datasets:
        raise UserError(f"--datasets names no dataset; give some of {', '.join(names)}")
    if args.train_per_class < 1 or args.test_per_class < 1:
        raise UserError("--train-per-class and --test-per-class must be at least 1")
    root = Path(args.data_root).expanduser()
    try:
        record = make_fake_data(
            root, datasets, args.train_per_class, args.test_per_class, args.seed, weights=not args.no_weights
        )
    except OSError as err:  # a full disk, a folder one may not write, a root under a file
        where = f" ({err.filename})" if err.filename else ""
        raise UserError(
            f"cannot write the fake data{where}: {err.strerror}; choose another --data-root"
        ) from None
    weights = f" --weights {record['weights']}" if "weights" in record else ""
    print(
        f"fake data in {root}; walk a real suite on it with:\n"
        f"  python -m benchmarks.run --suite main --fast-dev-run --data-root {root}{weights}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
