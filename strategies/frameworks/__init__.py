"""Adapters that bring strategies written for other frameworks under the suite's protocol.

One module per framework, each with ``adapt(cls, name) -> type``: a class that meets the runner's
contract (``strategies.contract``) around the framework's own class. ``strategies.registry`` picks
the module by the name's prefix: ``avalanche:``, ``pycil:`` or ``mammoth:``. Every adapter builds
its model on the run's CLIP backbone (``strategies.frameworks.common``), so the comparison with
the suite's own strategies is under the same backbone, data, class order and test set.
"""
