"""Continual CoOp, an example strategy from outside the suite (docs/adding-a-strategy.md)."""
