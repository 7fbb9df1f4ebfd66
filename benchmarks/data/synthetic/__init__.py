"""The synthetic world of the offline miniature: its classes and renders (``world``), its two
domains (``domains``) and the image-caption pairs that pretrain the tiny CLIP (``captions``).
All pure functions of a seed."""
