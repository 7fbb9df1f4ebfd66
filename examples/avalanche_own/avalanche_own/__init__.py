"""An Avalanche strategy of one's own that runs under clip-cil-bench (docs/adding-a-strategy.md)."""
