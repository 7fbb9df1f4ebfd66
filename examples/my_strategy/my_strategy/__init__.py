"""An example strategy that lives outside clip-cil-bench (see docs/adding-a-strategy.md)."""
