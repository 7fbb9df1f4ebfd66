"""The offline miniature of the real setting: a synthetic world, its captions, a tiny CLIP
pretrained on them, and a report of how faithful the miniature is.

* ``world``: the synthetic classes and their renders (pure functions of a seed);
* ``domains``: the "photo" pretraining domain and the shifted "faded" CIL domain;
* ``captions``: image-caption pairs for pretraining;
* ``pretrain``: ``python -m benchmarks.miniature.pretrain`` makes the shipped checkpoint;
* ``report``: ``python -m benchmarks.miniature.report`` measures zero-shot, the modality gap and
  joint fine-tuning on the smoke's CIL data.
"""
