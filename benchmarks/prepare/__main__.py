"""``python -m benchmarks.prepare``: see ``benchmarks.prepare.command``."""

import sys

from benchmarks.prepare.command import main

if __name__ == "__main__":
    sys.exit(main())
