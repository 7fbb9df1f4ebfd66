"""Datasets, class orders, streams, backbones, suites, runner and results store."""

import warnings

# Avalanche imports qpsolvers, which warns about optional solvers this suite never uses.
warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
