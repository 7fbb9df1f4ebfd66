"""Build the resized cache of folder datasets: ``python -m benchmarks.tools.resized_cache imagenet_r``.

Each image is decoded and resized once (RGB, bicubic, shorter side ``--image-size``, PIL's own
resize) into one memory-mapped file under ``<data-root>/.resized/`` (``benchmarks.data.resized_cache``).
A run on that data root then reads its pixels from there instead of decoding and resizing every
JPEG every epoch, with the same pixels bit for bit. The build writes beside its final folder and
renames it into place, so a build that dies leaves nothing half written; rerun it to finish.
"""

from __future__ import annotations

import sys

from benchmarks.core.errors import CommandParser, UserError, one_line_storage_errors, one_line_user_errors
from benchmarks.data.datasets import load_dataset
from benchmarks.data.image_lists import FileListDataset
from benchmarks.data.resized_cache import build_resized_cache, cache_folder, dataset_paths


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m benchmarks.tools.resized_cache", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "datasets", nargs="+", metavar="DATASET", help="registered folder datasets, e.g. imagenet_r"
    )
    parser.add_argument("--data-root", default="data", help="folder holding the datasets (default: ./data)")
    parser.add_argument("--image-size", type=int, default=224, help="the model's input size (default: 224)")
    args = parser.parse_args(argv)
    if args.image_size < 1:
        raise UserError("--image-size must be at least 1")
    for name in args.datasets:
        data = load_dataset(name, args.data_root)
        if not isinstance(data.test, FileListDataset):
            raise UserError(f"{name} is held in memory; it has no image files to cache")
        train = data.train.samples if isinstance(data.train, FileListDataset) else None
        paths = dataset_paths(data.test.samples, train)
        folder = cache_folder(args.data_root, name, paths, args.image_size)
        # a file that will not decode is a UserError naming it; here only the writing can fail
        with one_line_storage_errors("write the cache", "free space or use another --data-root"):
            build_resized_cache(paths, args.image_size, folder)
        print(f"{name}: {len(paths)} images at {args.image_size} px in {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
