"""open_clip's registry read without importing open_clip (``benchmarks.backbone.registry``): the stored
tags are the installed open_clip's, every answer of the stored route is open_clip's own, another
open_clip version is asked itself, and the offline weights target does not import open_clip."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import open_clip
import pytest

from benchmarks.backbone import TINY_MODEL, registry
from benchmarks.backbone.tags import check_tag, hub_files
from benchmarks.core.errors import UserError


@pytest.fixture
def stored(monkeypatch):
    """The registry as ``prepare`` reads it: open_clip not asked, though this process imported it."""
    monkeypatch.setattr(registry, "_live", lambda: None)
    return registry


def test_the_stored_tags_are_the_installed_open_clips():
    """Fails after an open_clip upgrade until ``python -m benchmarks.backbone.registry`` is rerun."""
    on_disk = json.loads(registry.STORED_TAGS.read_text())
    assert on_disk == json.loads(json.dumps(registry.stored_table()))  # JSON's types: lists, not tuples
    assert registry._stored() is not None  # the version matches, so prepare reads it


def test_every_model_config_and_its_order_are_open_clips(stored):
    live = open_clip.list_models()
    assert TINY_MODEL in live  # the suite's own config, as the loader adds it
    assert stored.list_models() == live
    for name in live:
        assert stored.get_model_config(name) == open_clip.get_model_config(name), name
    assert stored.get_model_config("ViT-B16") is None


def test_every_tag_is_open_clips_in_its_order_whatever_its_spelling(stored):
    for model, tag in open_clip.list_pretrained():
        assert stored.list_pretrained_tags_by_model(model) == open_clip.list_pretrained_tags_by_model(model)
        for spelling in (tag, tag.upper(), tag.replace("_", "-")):  # open_clip folds case and hyphens
            assert stored.get_pretrained_cfg(model, spelling) == open_clip.get_pretrained_cfg(model, spelling)
    assert (
        stored.get_pretrained_cfg("ViT-B-16", "nosuch") == {} == stored.get_pretrained_cfg("nosuch", "openai")
    )
    assert stored.list_pretrained_tags_by_model("nosuch") == []


def test_a_returned_config_is_a_copy(stored):
    stored.get_pretrained_cfg("ViT-B-16", "laion400m_e32")["url"] = "changed"
    stored.get_model_config("ViT-B-16")["embed_dim"] = 0
    assert stored.get_pretrained_cfg("ViT-B-16", "laion400m_e32")["url"].endswith("55e67d44.pt")
    assert stored.get_model_config("ViT-B-16")["embed_dim"] == 512


@pytest.mark.parametrize(
    "model, tag",
    [
        ("ViT-B-16", "laion400m"),  # a close tag
        ("ViT-B-16", "openai"),  # the other activation
        ("ViT-B-16-quickgelu", "laion400m_e32"),
        ("ViT-L-14", "laion2b_s32b_b82k"),  # fine
        ("ViT-B-16", "laion2b_s34b_b88k"),  # hub only
    ],
)
def test_the_tag_checks_say_the_same_through_either_route(model, tag, monkeypatch):
    def answer():
        try:
            cfg = check_tag(model, tag)
        except UserError as err:
            return str(err)
        return cfg, hub_files(cfg)

    live = answer()
    monkeypatch.setattr(registry, "_live", lambda: None)
    assert answer() == live


def test_another_open_clip_version_is_asked_itself(monkeypatch):
    monkeypatch.setattr(registry.importlib.metadata, "version", lambda name: "0.0.1")
    registry._stored.cache_clear()
    try:
        assert registry._stored() is None
        assert registry._live() is open_clip
    finally:
        monkeypatch.undo()
        registry._stored.cache_clear()


def test_the_offline_weights_target_imports_neither_open_clip_nor_torchvision(tmp_path):
    """The one line comes without the seconds open_clip takes to import (it brings torchvision and
    transformers: 8 of the 12 s the target took on 2 idle cores)."""
    probe = (
        "import sys\n"
        "from benchmarks.prepare.command import main\n"
        "code = main(['weights:ViT-B-16/laion400m_e32', '--data-root', sys.argv[1], '--quiet'])\n"
        "print(code, sorted({'open_clip', 'torchvision', 'transformers'} & set(sys.modules)))\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert done.stdout.splitlines()[-1] == "2 []"
    assert done.stderr.count("\n") == 1 and "needs the network" in done.stderr
