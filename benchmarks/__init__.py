"""Datasets, class orders, streams, backbones, suites, runner and results store, in layers.

Each layer imports only from itself and the layers below it (``tests/docs/test_layers.py``
checks this over the tree):

0. ``core``: errors, precision, environment, atomic writes, protocol metrics, subspaces
1. ``data``: datasets (one registered unit each, ``data/units/``), the synthetic world, class orders,
   transforms, prompts, loaders, streams
2. ``backbone``: CLIP models, weights, LoRA, adapters, prompts inside the encoder
3. ``strategies`` (its own top-level package): one file per method
4. ``runner``: suites, results store, locks, executing a run, launchers, status
5. ``analysis`` (top-level package: tables, report, comparison), ``miniature`` and ``tools``
6. ``run``: the command line
"""

import warnings

# Avalanche imports qpsolvers, which warns about optional solvers this suite never uses.
warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
