"""The offline miniature's tools, above the runner: ``pretrain`` makes the shipped tiny CLIP from
the synthetic world's captions (``python -m benchmarks.miniature.pretrain``), and ``report``
measures how faithful the miniature is: zero-shot, the image-prototype and linear-probe cues, the
modality gap and joint fine-tuning on the smoke's CIL data (``python -m benchmarks.miniature.report``).
The world itself is data: ``benchmarks.data.synthetic``."""
