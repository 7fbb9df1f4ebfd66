"""``python -m benchmarks.prepare``: see ``benchmarks.prepare``."""

import sys

from benchmarks.prepare import main

sys.exit(main())
