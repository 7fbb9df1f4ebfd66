"""``python -m benchmarks.miniature_report``: the same as ``python -m benchmarks.miniature.report``."""

from benchmarks.miniature.report import main

if __name__ == "__main__":
    raise SystemExit(main())
