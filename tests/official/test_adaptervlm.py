"""AdapterVLM against its official code (Fatflower/CIL_Adapted_VLM, fixtures adaptervlm.lora,
adaptervlm.loss and adaptervlm.scores, written by
``tests/official/goldens/cil_adapted_vlm_{repo,loss}.py``): the LoRA on k and v of both towers
(forward, gradients, the visual branch of each task at test), the training loss with its four terms
and gradients, and the prototypes, scores, task choice and prediction after each of three tasks."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from strategies.methods.adaptervlm import AdapterVLM, AdapterVLMConfig, aux_head, loss_terms, prototype
from tests.official.goldens.cil_adapted_vlm_repo import DIM, suite_strategy
from tests.official.goldens.golden import load_golden

# Attention outputs are O(1): float32 rounding of SDPA against the official bmm + softmax.
ATTENTION_ATOL = 1e-5
# Gradients of A and B sum some thousand O(1) products: float32 rounding, relative.
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
# Loss terms O(0.01-5), the same float32 operations in another order.
LOSS_ATOL = 1e-5
# Gradients of embeddings and of the aux MLP: O(0.01-1), float32 rounding through normalise + softmax.
LOSS_GRAD_ATOL = 1e-6
# Unit vectors, cosines and sums of two cosines: float32 rounding of 512-long dot products.
SCORE_ATOL = 1e-6


@pytest.fixture(scope="module")
def lora_fixture():
    return load_golden("adaptervlm.lora")


@pytest.fixture(scope="module")
def loss_fixture():
    return load_golden("adaptervlm.loss")


@pytest.fixture(scope="module")
def scores_fixture():
    return load_golden("adaptervlm.scores")


# ============================================================================ LoRA
@pytest.fixture(scope="module")
def strategy(lora_fixture):
    """AdapterVLM on the tiny CLIP with text, visual_1 and visual_2 (setup_task(1)'s copy), block 0's
    attention of each tower loaded with the fixture's weights."""
    tensors, _ = lora_fixture
    strategy = suite_strategy()
    strategy.task_classes.append([0, 1])
    strategy.setup_task(1, [2, 3])
    model = strategy.backbone.model
    with torch.no_grad():
        for tower, attn in (
            ("visual", model.visual.transformer.resblocks[0].attn),
            ("text", model.transformer.resblocks[0].attn),
        ):
            for name in ("q_proj", "out_proj", "k_proj", "v_proj"):
                layer = getattr(attn, name)
                layer = getattr(layer, "base_layer", layer)
                layer.weight.copy_(tensors[f"param.{tower}.{name}.weight"])
                layer.bias.copy_(tensors[f"param.{tower}.{name}.bias"])
        for adapter in ("text", "visual_1", "visual_2"):
            tower = model.transformer if adapter == "text" else model.visual.transformer
            attn = tower.resblocks[0].attn
            for proj in ("k_proj", "v_proj"):
                for part in ("A", "B"):
                    weight = getattr(getattr(attn, proj), f"lora_{part}")[adapter].weight
                    weight.copy_(tensors[f"param.{adapter}.{proj}.lora_{part}"])
    return strategy


def _attention(strategy, tower):
    model = strategy.backbone.model
    return (model.visual.transformer if tower == "visual" else model.transformer).resblocks[0].attn


def _forward(attn, x, mask=None):
    """x [N, L, E] as the official layer takes it."""
    batch_first = x if attn.batch_first else x.transpose(0, 1)
    out = attn(batch_first, batch_first, batch_first, need_weights=False, attn_mask=mask)[0]
    return out if attn.batch_first else out.transpose(0, 1)


@pytest.mark.parametrize(("tower", "adapter"), [("text", "text"), ("visual", "visual_2")])
def test_lora_attention_forward_and_gradients_equal_the_official_layer(
    lora_fixture, strategy, tower, adapter
):
    tensors, _ = lora_fixture
    attn = _attention(strategy, tower)
    strategy.backbone.set_adapters(visual="visual_2", text="text")  # as in training task 2
    assert attn.k_proj.scaling[adapter] == pytest.approx(float(tensors[f"output.{tower}.scaling"]))
    for p in strategy.backbone.lora_parameters(adapter):
        p.grad = None
    mask = tensors.get(f"input.{tower}.causal_mask")
    mask = None if mask is None else mask[0, 0]  # [N, 1, L, L] -> the [L, L] mask the tower passes
    out = _forward(attn, tensors[f"input.{tower}.x"], mask)
    (out * tensors[f"input.{tower}.loss_weight"]).sum().backward()
    torch.testing.assert_close(out, tensors[f"output.{tower}.attention"], rtol=0, atol=ATTENTION_ATOL)
    for proj in ("k_proj", "v_proj"):
        for part in ("A", "B"):
            ours = getattr(getattr(attn, proj), f"lora_{part}")[adapter].weight.grad
            official = tensors[f"grad.{adapter}.{proj}.lora_{part}"]
            torch.testing.assert_close(ours, official, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_each_task_branch_equals_the_official_checkpoint_of_that_task(lora_fixture, strategy):
    """loralib 0.1.1 (the official pin): eval_task's branch tau is checkpoint tau's LoRA. The suite
    runs both branches in one mixed-adapter forward, as encode_image_multi does."""
    tensors, _ = lora_fixture
    attn = _attention(strategy, "visual")
    x = tensors["input.branches.x"]
    attn.eval()
    with (
        torch.no_grad(),
        strategy.backbone._mixed_adapter_batch(["visual_1"] * len(x) + ["visual_2"] * len(x)),
    ):
        out = _forward(attn, torch.cat([x, x]))
    for branch, ours in enumerate(out.split(len(x)), start=1):
        official = tensors[f"output.branches.loralib_0.1.1.branch{branch}"]
        torch.testing.assert_close(ours, official, rtol=0, atol=ATTENTION_ATOL)
    assert not tensors["output.branches.loralib_0.1.1.merged"]


def test_loralib_0_1_2_puts_every_branch_on_the_latest_visual_lora(lora_fixture, strategy):
    """The trap of docs/baselines.md §4 and §14, as the official code runs: under loralib 0.1.2,
    eval() merges B A into the weight and loading an older checkpoint changes only lora_A/B."""
    tensors, _ = lora_fixture
    assert tensors["output.branches.loralib_0.1.2.merged"]
    latest = tensors["output.branches.loralib_0.1.1.branch2"]
    for branch in (1, 2):
        out = tensors[f"output.branches.loralib_0.1.2.branch{branch}"]
        torch.testing.assert_close(out, latest, rtol=0, atol=ATTENTION_ATOL)
    first = tensors["output.branches.loralib_0.1.1.branch1"]
    assert (tensors["output.branches.loralib_0.1.2.branch1"] - first).abs().max() > 100 * ATTENTION_ATOL


# ============================================================================ loss
def _loss_step(tensors, task, step):
    """The suite's compute_logits and compute_loss on the fixture's embeddings of one official step."""
    cfg = AdapterVLMConfig()
    per_task = 3
    begin, end = task * per_task, (task + 1) * per_task
    prefix = f"input.task{task + 1}."
    images = tensors[prefix + "images"].clone().requires_grad_()
    texts = tensors["input.texts"].clone().requires_grad_()
    by_position = texts[tensors["input.order"]]  # row p: the class at position p of the order
    aux = aux_head(DIM, per_task)
    with torch.no_grad():
        for name, p in aux.named_parameters():
            p.copy_(tensors[f"param.task{task + 1}.aux.{name}"])
    ids = tensors[f"{prefix}step{step}.image_ids"]
    batch = len(ids) // 2
    stub = SimpleNamespace(
        _next_ood_batch=lambda: ids[batch:],
        backbone=SimpleNamespace(
            encode_image=lambda x, normalize=True: images[x],
            logit_scale=float(tensors["param.logit_scale"].exp()),
        ),
        text_features=lambda classes: F.normalize(by_position[classes], dim=-1),
        seen_classes=list(range(begin)),
        current_classes=list(range(begin, end)),
        aux=aux,
        anchors=tensors[prefix + "anchors"],
        device_copy=lambda name, t: t,
        cfg=cfg,
    )
    targets = tensors[prefix + "labels"][ids[:batch]] - begin
    output = AdapterVLM.compute_logits(stub, ids[:batch])
    loss = AdapterVLM.compute_loss(stub, output, targets)
    terms = loss_terms(output, targets, stub.anchors, begin, cfg.tau)
    loss.backward()
    grads = {"images": images.grad, "texts": texts.grad}
    grads.update({f"aux.{n}": p.grad for n, p in aux.named_parameters()})
    return loss, terms, grads


@pytest.mark.parametrize(("task", "step"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_loss_terms_and_gradients_equal_the_official_epoch_train(loss_fixture, task, step):
    tensors, _ = loss_fixture
    loss, terms, grads = _loss_step(tensors, task, step)
    out = f"output.task{task + 1}.step{step}."
    official_terms = {"clip": "clip", "ce": "ce", "dist": "dist", "anchor": "anchor"}
    assert set(terms) == {k for k in official_terms if out + k in tensors}
    for ours, theirs in official_terms.items():
        if out + theirs in tensors:
            torch.testing.assert_close(terms[ours], tensors[out + theirs], rtol=0, atol=LOSS_ATOL)
    torch.testing.assert_close(loss, tensors[out + "loss"], rtol=0, atol=LOSS_ATOL)
    for name, grad in grads.items():
        official = tensors[f"grad.task{task + 1}.step{step}.{name}"]
        torch.testing.assert_close(grad, official, rtol=0, atol=LOSS_GRAD_ATOL)


# ============================================================================ scores
def _seen(stage):
    return [list(range(3 * t, 3 * t + 3)) for t in range(stage)]


def _suite_prototypes(tensors, stage):
    labels, is_test = tensors["input.labels"], tensors["input.is_test"].bool()
    out = []
    for task, classes in enumerate(_seen(stage), start=1):
        table = tensors[f"input.branch{task}.table"]
        out.append(torch.stack([prototype(table[(labels == c) & ~is_test]) for c in classes]))
    return out


def test_prototypes_equal_the_official_ones(scores_fixture):
    tensors, _ = scores_fixture
    for task, ours in enumerate(_suite_prototypes(tensors, 3), start=1):
        official = tensors[f"output.branch{task}.prototypes"]
        torch.testing.assert_close(ours, official, rtol=0, atol=SCORE_ATOL)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_scores_task_choice_and_prediction_equal_the_official_eval_task(scores_fixture, stage):
    tensors, _ = scores_fixture
    cfg = AdapterVLMConfig()
    test_ids = tensors[f"input.stage{stage}.test_ids"]
    text = F.normalize(tensors[f"input.stage{stage}.text"][: 3 * stage], dim=-1)
    torch.testing.assert_close(text, tensors[f"output.stage{stage}.text_features"], rtol=0, atol=SCORE_ATOL)
    branches = [f"visual_{t}" for t in range(1, stage + 1)]
    tables = [tensors[f"input.branch{t}.table"] for t in range(1, stage + 1)]
    stub = SimpleNamespace(
        task_classes=_seen(stage),
        prototypes=_suite_prototypes(tensors, stage),
        cfg=cfg,
        branches=branches,
        seen_classes=list(range(3 * stage)),
        text_features=lambda classes: text[classes],
        backbone=SimpleNamespace(
            encode_image_multi=lambda ids, names: torch.stack(
                [F.normalize(tables[branches.index(n)][ids], dim=-1) for n in names]
            )
        ),
    )
    stub._scores_from_features = lambda features, t: AdapterVLM._scores_from_features(stub, features, t)
    q = AdapterVLM.scores(stub, test_ids)
    torch.testing.assert_close(q, tensors[f"output.stage{stage}.scores"], rtol=0, atol=SCORE_ATOL)
    task_max = torch.stack([block.max(dim=1).values for block in q.split(3, dim=1)], dim=1)
    torch.testing.assert_close(task_max, tensors[f"output.stage{stage}.task_max"], rtol=0, atol=SCORE_ATOL)
    assert torch.equal(task_max.argmax(dim=1), tensors[f"output.stage{stage}.task_id"])
    prediction = q.argmax(dim=1)  # the flat argmax
    assert torch.equal(prediction, tensors[f"output.stage{stage}.prediction"])
    accuracy = 100 * (prediction == tensors["input.labels"][test_ids]).double().mean()
    assert float(accuracy) == pytest.approx(float(tensors[f"output.stage{stage}.accuracy"]), abs=1e-4)
