"""Layer 1: datasets (real and synthetic), class orders, transforms, prompts, data loaders and
Avalanche streams. Imports only ``benchmarks.core``."""
