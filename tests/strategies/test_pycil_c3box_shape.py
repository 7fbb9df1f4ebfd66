"""The ``pycil:`` adapter runs a learner in C3Box's shape with no edit to it
(``tests/strategies/c3box_shaped/``, written here; strategies/frameworks/pycil_clip.py): its factory
gets a trainable copy of the run's CLIP for each call, a network that calls open_clip itself gets
the run's model (never a download), its DataManager holds the run's class names and prompt, its
``args`` the stream's task sizes, its ``.cuda()`` runs on the run's device, and the suite's scores
are the logits its own ``_eval_cnn`` ranks."""

import os
from pathlib import Path

import pytest
import torch

from strategies.settings import RunSettings

SHAPED = Path(__file__).parent / "c3box_shaped"
LIKE = "pycil:c3box_like.learner:Learner"
ORDER = list(range(12))


@pytest.fixture(autouse=True)
def _shaped_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SHAPED))


def built(stream, **options):
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.registry import get_strategy

    cls = get_strategy(LIKE)
    torch.manual_seed(0)
    return cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=stream.class_names,
        config=cls.Config.from_dict(options, LIKE),
        settings=RunSettings(show_progress=False, seed=0),
    )


def open_clip_layout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (the run's CLIP, attention split) as open_clip builds it: fused attention."""
    import copy

    from benchmarks.backbone import fuse_attention_

    model = copy.deepcopy(model)
    fuse_attention_(model)
    return model


def same_tensors(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_each_factory_call_gets_a_trainable_copy_of_the_run_clip(stream):
    with pytest.warns(UserWarning) as said:
        strategy = built(stream)
    lines = [str(w.message) for w in said]
    assert any("C3Box's shape" in line for line in lines)
    # its PtmNet rebuilds the tower with 64-wide heads; the tiny CLIP's are 32 wide: said once
    (heads,) = [line for line in lines if "attention heads" in line]
    assert "with 64-wide attention heads" in heads and "the run's CLIP has 32-wide heads" in heads
    network, run = strategy.learner._network, strategy.backbone.model
    as_built = open_clip_layout(run)  # open_clip's own modules and keys, as C3Box's code expects
    assert network.convnet is not run and same_tensors(network.convnet, as_built)
    assert network.feature_dim == strategy.backbone.embed_dim  # not the 512 the factory wrote
    assert network.tokenizer is strategy.backbone.tokenizer
    # the network called the factory twice: two copies, none shared with the run's frozen model
    assert all(p.requires_grad for p in network.convnet.parameters())
    assert not any(p.requires_grad for p in run.parameters())
    # a network that calls open_clip itself got the run's model too, not a download
    assert same_tensors(strategy.learner.direct.clip, as_built)
    # and one that reads ./c.pth found the run's weights there, every block counted by its keys
    ptm = strategy.learner.ptm
    assert same_tensors(ptm.clip, as_built) and ptm.vision_layers == len(run.visual.transformer.resblocks)
    workdir = strategy.c3box.workdir
    assert os.path.samefile(workdir / "c.pth", workdir / ".p" / "c.pth")  # TUNA's path: one file
    import open_clip

    assert open_clip.create_model_and_transforms.__module__ == "open_clip.factory"  # put back


def test_a_clip_of_c3box_head_width_reads_its_state_file_without_a_word(stream, monkeypatch):
    import warnings

    from strategies.frameworks import pycil_clip

    monkeypatch.setattr(pycil_clip, "C3BOX_HEAD_WIDTH", 32)  # as if C3Box's heads were the tiny CLIP's
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        strategy = built(stream)
    assert not [w for w in said if "attention heads" in str(w.message)]
    assert strategy.learner.ptm.vision_layers == 4  # it did read ./c.pth


@pytest.mark.slow
def test_names_prompts_and_task_sizes_come_from_the_run(stream):
    strategy = built(stream, prompt_template="a photo of the {}.")
    for task in (0, 1):
        torch.manual_seed(task)
        strategy.learn(stream.train_stream[task])
    manager, learner = strategy.data_manager, strategy.learner
    assert manager._class_to_label == [stream.class_names[c] for c in strategy.seen_classes]
    assert manager._data_to_prompt == ["a photo of the {}."]
    assert learner.sizes_seen == [(4, 4), (4, 4)] and learner._total_classes == 8
    assert "init_cls" not in strategy.cfg.args  # the run's, not the suite's
    assert not any(p.requires_grad for p in strategy.backbone.model.parameters())


def test_the_scores_are_the_logits_its_eval_cnn_ranks(stream, test_images):
    import c3box_like.learner as module

    strategy = built(stream)
    here = os.getcwd()
    strategy.learn(stream.train_stream[0])
    # its code ran in the run's own working directory, and the suite's is back
    assert strategy.learner.cwds == [os.path.realpath(strategy.c3box.workdir)] and os.getcwd() == here
    images = test_images[0][:6]
    module.RANKED.clear()
    scores = strategy.scores(images)
    (ranked,) = module.RANKED
    assert scores.shape == (6, 4) and torch.equal(scores, ranked.float())
    with torch.no_grad(), strategy._upstream("computing its logits"):  # its .cuda() on the CPU
        strategy.learner._network.eval()
        assert torch.allclose(scores, strategy.learner.logits(images))


def test_a_suite_that_sets_other_task_sizes_is_one_line(stream):
    from benchmarks.core.errors import UserError

    strategy = built(stream, args={"init_cls": 5})
    with pytest.raises(UserError, match="args init_cls = 5, but the run's tasks have 4, 4, 4 classes"):
        strategy.learn(stream.train_stream[0])


@pytest.mark.slow
def test_a_fast_dev_run_scores_with_its_own_logits(tmp_path, monkeypatch):
    import c3box_like.learner as module

    from strategies.frameworks.pycil import PyCILAdapter
    from tests.helpers import run_one_run_suite, three_task_suite

    monkeypatch.setenv("PYTHONPATH", str(SHAPED))
    module.RANKED.clear()
    given = []
    scores = PyCILAdapter.scores

    def kept(self, images):
        given.append(scores(self, images))
        return given[-1]

    monkeypatch.setattr(PyCILAdapter, "scores", kept)
    _, _, result = run_one_run_suite(tmp_path, three_task_suite(LIKE, ""), "--fast-dev-run")
    assert len(result["stages"]) == 3
    assert given and len(given) == len(module.RANKED)
    assert all(torch.equal(s, r.float()) for s, r in zip(given, module.RANKED))
    assert module.tuned_epoch == 8  # its module as written
