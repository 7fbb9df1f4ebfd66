"""Datasets, class orders, streams, backbones, suites, runner and results store, in layers.

Each layer imports only from itself and the layers below it (``tests/docs/test_layers.py``
checks this over the tree, and that this list names every part):

0. ``core``: errors, precision, environment, atomic writes, JSON records, protocol metrics, subspaces
1. ``data``: datasets (one registered unit each, ``data/units/``), the synthetic world, class orders,
   transforms, prompts, loaders, streams
2. ``backbone``: CLIP models, weights, LoRA, adapters, prompts inside the encoder
3. ``strategies`` (its own top-level package): one file per method
4. ``runner``: suites, results store and its reader, locks, executing a run, launchers, status, live logs
5. ``analysis`` (top-level package: tables, report, comparison), ``miniature`` (the tiny CLIP's
   pretraining and measurements) and ``tools`` (measurements and data commands built on the runner)
6. the command line: ``run`` (its parser) and ``run_suite`` (its body), ``tune`` (its parser),
   ``tune_space`` (its search space) and ``tune_study`` (Optuna studies on a validation split),
   ``prepare`` (the only downloads) and ``tools.walk`` (which drives ``run`` as a user would)
"""

import warnings

# Avalanche imports qpsolvers, which warns about optional solvers this suite never uses.
warnings.filterwarnings("ignore", message="no QP solver found", category=UserWarning)
