"""Tests of the methods, one module or more per file of ``strategies/methods/``."""
