"""Tests of the base's training parts, one module per file of ``strategies/training/``."""
