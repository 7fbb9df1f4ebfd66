"""Preparing data and weights, the suite's only downloads: ``python -m benchmarks.prepare``.

``command`` is the command (its targets, what a crash leaves, what it never does); ``weights`` its
weights targets by open_clip tag; ``fetch`` downloads, ``safe_extract`` unpacks archives, ``lock``
keeps two commands off one target.
"""
