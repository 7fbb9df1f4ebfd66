"""The parts ``CLIPStrategy`` (``strategies.base``) is composed of, each small and tested alone.

Mixins, whose methods every strategy has as its own: ``text`` (CLIP's text classifier),
``evaluation`` (the runner's entry, Avalanche's ``eval`` layout), ``features`` (image features
encoded once and kept), ``loaders`` (seeded loaders; a fast dev run caps the training passes),
``second_stage`` (a head trained on frozen features), ``parameters`` (what trains, found without a
hook, and its count) and ``mixed_precision`` (fp16's loss scaler and the optimiser step). Avalanche
plugins, which the base attaches to every strategy: ``progress`` (a bar per task) and ``watchdog``
(a warning when an epoch changed nothing).
"""
