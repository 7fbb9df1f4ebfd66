"""The pretraining world of the tiny CLIP, the pretraining command and the shipped checkpoint."""

from __future__ import annotations

import functools
import json
import re

import numpy as np
import pytest
import torch

from benchmarks.backbone import SYNTHETIC_CHECKPOINTS, TINY_MODEL, BackboneSpec, create_clip
from benchmarks.data.synthetic import captions as C
from benchmarks.data.synthetic import world as S
from benchmarks.data.transforms import eval_transform
from benchmarks.data.units.synthetic import load_synthetic
from benchmarks.miniature.pretrain import images_to_tensor, main, parse_args
from benchmarks.miniature.report import evaluate_zero_shot


@functools.cache
def _pattern(phrases: tuple[str, ...]) -> re.Pattern[str]:
    # Whole words only, and a hyphenated word is one word: "polka-dot" does not mention "dot".
    return re.compile("|".join(rf"(?<![\w-]){re.escape(p)}(?![\w-])" for p in phrases))


def _mentions(text: str, phrases: tuple[str, ...]) -> bool:
    """Whether ``text`` contains one of ``phrases`` as whole words."""
    return _pattern(phrases).search(text) is not None


def _others(table: tuple[tuple[str, ...], ...], index: int) -> tuple[str, ...]:
    return tuple(word for i, words in enumerate(table) if i != index for word in words)


@pytest.fixture(scope="module")
def pairs() -> tuple[S.ImageAttributes, np.ndarray, list[str]]:
    return C.sample_pretraining_pairs(2000, C.pretraining_rng(0))


def test_captions_are_deterministic_and_varied(pairs) -> None:
    attributes, _, texts = pairs
    first, again = (C.sample_pretraining_pairs(200, C.pretraining_rng(0)) for _ in range(2))
    assert again[2] == first[2] and np.array_equal(again[1], first[1])
    assert C.sample_pretraining_pairs(200, C.pretraining_rng(1))[2] != first[2]
    assert C.captions(attributes, np.random.default_rng(5)) == C.captions(
        attributes, np.random.default_rng(5)
    )
    assert len(set(texts)) > 0.5 * len(texts)
    # The zero-shot prompt form is among the captions, but only sometimes.
    prompts = sum(
        text == C.ZERO_SHOT_PROMPT.format(S.class_name(int(c))) for text, c in zip(texts, attributes.class_id)
    )
    assert 0.05 < prompts / len(texts) < 0.3


def test_captions_mention_only_the_true_attributes(pairs) -> None:
    attributes, _, texts = pairs
    tables = (
        ("shape", C.SHAPE_WORDS),
        ("colour", C.COLOUR_WORDS),
        ("pattern", tuple(w + p for w, p in zip(C.PATTERN_WORDS, C.PATTERN_PHRASES, strict=True))),
        ("size", C.SIZE_WORDS),
        ("background", C.BACKGROUND_PHRASES),
    )
    mentioned = {name: 0 for name, _ in tables}
    mentioned["distractor"] = 0
    for row, text in enumerate(texts):
        if attributes.distractor[row]:
            # The distractor's clause names its own colour and shape; the rest describes the object.
            colour = C.COLOUR_WORDS[int(attributes.distractor_colour[row])][0]
            shape = C.SHAPE_WORDS[int(attributes.distractor_shape[row])][0]
            links = "|".join(C.DISTRACTOR_LINKS)
            text, found = re.subn(
                rf" (?:{links}) an? {re.escape(colour)} {re.escape(shape)}(?![\w-])", "", text
            )
            mentioned["distractor"] += found
        assert not _mentions(text, C.DISTRACTOR_LINKS[:1]), (
            text
        )  # no clause left, and none without a distractor
        for name, table in tables:
            value = int(getattr(attributes, name)[row])
            assert not _mentions(text, _others(table, value)), (text, name)
            mentioned[name] += _mentions(text, table[value])
    assert mentioned["shape"] == len(texts)  # every caption names the object
    assert mentioned["colour"] > 0.8 * len(texts)
    for name in ("pattern", "size", "background"):  # partial descriptions are common
        assert 0.2 * len(texts) < mentioned[name] < 0.95 * len(texts), name
    with_distractor = int(attributes.distractor.sum())
    assert 0.3 * with_distractor < mentioned["distractor"] < 0.95 * with_distractor


def test_held_out_combinations_never_reach_pretraining(pairs) -> None:
    attributes = pairs[0]
    cil = set(S.default_class_ids())
    held = set(C.PRETRAIN_HELD_OUT)
    assert held < cil and 0.3 * len(cil) <= len(held) <= 0.6 * len(cil)
    assert held.isdisjoint(C.PRETRAIN_CLASS_IDS) and held | set(C.PRETRAIN_CLASS_IDS) == set(
        range(S.N_CLASSES)
    )
    assert held.isdisjoint(attributes.class_id.tolist())
    assert len(cil - held) > 0 and (cil - held) & set(attributes.class_id.tolist())
    # Every single attribute value is still learnt, through other combinations.
    for name, vocabulary in (
        ("colour", S.COLOUR_NAMES),
        ("pattern", S.PATTERN_NAMES),
        ("shape", S.SHAPE_NAMES),
    ):
        assert set(getattr(attributes, name).tolist()) == set(range(len(vocabulary))), name


def test_fast_normalisation_matches_eval_transform(pairs) -> None:
    images = pairs[1][:8]
    from PIL import Image

    expected = torch.stack([eval_transform(32)(Image.fromarray(image)) for image in images])
    assert torch.allclose(images_to_tensor(images), expected, atol=1e-6)


@pytest.mark.slow
def test_short_pretraining_run_is_reproducible_and_loadable(tmp_path) -> None:
    trajectories = []
    for run in ("a", "b"):
        out = tmp_path / run / "tiny.safetensors"
        main(["--steps", "6", "--batch-size", "16", "--threads", "1", "--log-every", "1", "--out", str(out)])
        sidecar = json.loads(out.with_suffix(".json").read_text())
        assert sidecar["steps"] == 6 and sidecar["args"]["batch_size"] == 16
        trajectories.append(sidecar["loss_trajectory"])
    assert [step for step, _ in trajectories[0]] == list(range(1, 7))
    assert trajectories[0] == trajectories[1]
    assert all(np.isfinite(loss) for _, loss in trajectories[0])

    backbone = create_clip(BackboneSpec(TINY_MODEL, str(out)))
    with torch.no_grad():
        features = backbone.encode_text(backbone.tokenize(["a photo of a red striped triangle."]))
    assert features.shape == (1, backbone.model.text_projection.shape[1]) and torch.isfinite(features).all()


@pytest.mark.parametrize("model", sorted(SYNTHETIC_CHECKPOINTS))
def test_shipped_checkpoint_is_a_faithful_miniature(model) -> None:
    """Each tiny model's shipped checkpoint (256-d, and 512-d for learners that hard-code CLIP's
    width): made by ``pretrain`` with its defaults, and a CLIP in miniature."""
    shipped = SYNTHETIC_CHECKPOINTS[model]
    assert shipped.is_file(), f"run: python -m benchmarks.miniature.pretrain --model {model}"
    assert shipped.stat().st_size <= 15 * 2**20
    sidecar = json.loads(shipped.with_suffix(".json").read_text())
    defaults = {k: v for k, v in vars(parse_args(["--model", model])).items() if k not in ("out", "model")}
    assert {k: sidecar["args"][k] for k in defaults} == defaults and sidecar["model"] == model
    backbone = create_clip(BackboneSpec(model, "synthetic"))
    width = 512 if "-512" in model else 256
    assert backbone.model.text_projection.shape[1] == backbone.model.visual.proj.shape[1] == width
    data = load_synthetic(n_train_per_class=1, n_test_per_class=5)
    stats = evaluate_zero_shot(backbone, data)
    chance = 1 / data.n_classes
    assert stats.accuracy > 5 * chance
    assert stats.accuracy_held_out > 2 * chance  # composition reaches classes pretraining never showed
    # The modality gap: matched image-text pairs are less alike than images among themselves and texts
    # among themselves.
    assert stats.matched_cosine < min(stats.image_image_cosine, stats.text_text_cosine)


@pytest.fixture(scope="module")
def report_without_joint():
    """``python -m benchmarks.miniature.report --no-joint --quiet``: its exit code and output."""
    import contextlib
    import io

    from benchmarks.miniature.report import main as report_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = report_main(["--no-joint", "--quiet"])
    return code, out.getvalue()


@pytest.mark.slow
def test_miniature_report_measures_the_smoke_cil_data(report_without_joint):
    """The smoke's faded domain against photo, with the zero-shot and modality-gap targets met and
    the cue-balance targets measured."""
    code, out = report_without_joint
    assert code in (0, 1)
    for target in (
        "NCM minus zero-shot in [-8, +4] points",
        "linear probe minus NCM >= 10 points",
        "I-C < I-T on frozen features, head at its initialisation",
    ):
        assert f"target: {target}: " in out
    assert "domain faded, 100 classes, 5000 train / 2000 test images" in out
    assert "target: zero-shot in [40%, 65%]: met" in out
    assert "target: modality gap (matched below both within-modality cosines): met" in out
    assert "joint" not in out.split("target: modality gap")[1]


@pytest.mark.slow
def test_image_features_lie_more_in_the_compensation_space_than_in_the_text_span(report_without_joint):
    """Table 3 (right) on the frozen features, the head at its initialisation: I-C below I-T, as on
    every dataset of the paper (the 256-d embedding leaves room outside the prompts' span)."""
    _, out = report_without_joint
    assert "target: I-C < I-T on frozen features, head at its initialisation: met" in out, out


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 21, item 1: the world still misses the cue balance (NCM 14.7 points "
    "above zero-shot, the probe 2.9 above NCM; docs/miniature.md lists what was tried)",
)
def test_the_miniature_meets_every_target(report_without_joint):
    code, out = report_without_joint
    assert "MISSED" not in out and code == 0, out
