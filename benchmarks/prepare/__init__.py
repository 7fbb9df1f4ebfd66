"""Preparing data and weights, the suite's only downloads: ``python -m benchmarks.prepare``.

``command`` is the command (its targets, what a crash leaves, what it never does); ``fetch``
downloads, ``safe_extract`` unpacks archives, ``lock`` keeps two commands off one target.
"""
