"""Every GR4CIL equation against a hand computation on small tensors."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.core.subspace import (
    directional_distance,
    energy_basis,
    joint_basis,
    orthonormal_basis,
    symmetric_distance,
)
from strategies.methods.gr4cil import (
    _confidence_and_margin,
    anchor_loss,
    class_prototypes,
    clip_loss,
    compensation_head,
    compensation_logits,
    compensation_loss,
    fused_zero_shot_logits,
    fusion_weights,
    msp_threshold,
    orthogonal_projector,
    prototype_score,
    separation_loss,
    task_msp,
    text_subspace_basis,
    unified_scores,
)


def test_anchor_loss_eq1():
    text = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    anchors = torch.tensor([[3.0, 0.0], [1.0, 0.0]])
    # cos = 1 and 0 -> mean(1 - cos) = (0 + 1) / 2
    assert anchor_loss(text, anchors).item() == pytest.approx(0.5)


def test_separation_loss_eq2_counts_only_pairs_above_tau():
    seen = torch.tensor([[0.8, 0.6], [0.0, 1.0], [1.0, 0.0]])  # the new class is row 2
    new = seen[2:]
    # cos(new, others) = 0.8, 0.0 -> hinge at tau 0.7 = 0.1, 0 -> mean over the 2 others = 0.05
    assert separation_loss(new, seen, torch.tensor([2]), tau=0.7).item() == pytest.approx(0.05)
    assert separation_loss(new, seen, torch.tensor([2]), tau=0.9).item() == 0.0


def test_separation_loss_eq2_averages_over_new_classes():
    seen = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # rows 1 and 2 are new
    # class 1: others {0: cos 1, 2: cos 0} -> (0.5 + 0) / 2 = 0.25; class 2: others {0: 0, 1: 0} -> 0
    loss = separation_loss(seen[1:], seen, torch.tensor([1, 2]), tau=0.5)
    assert loss.item() == pytest.approx(0.125)


def test_clip_loss_eq3_is_scaled_cross_entropy_over_task_classes():
    image = F.normalize(torch.tensor([[1.0, 1.0]]), dim=1)
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    logits = 10.0 * torch.tensor([math.sqrt(0.5), math.sqrt(0.5), -math.sqrt(0.5)])
    expected = -(logits[1] - torch.logsumexp(logits, 0))
    # compute_logits gives logit_scale * <v, t_c>; eq. 3 is the cross-entropy on it
    assert clip_loss(10.0 * image @ text.T, torch.tensor([1])).item() == pytest.approx(
        expected.item(), rel=1e-6
    )


@pytest.fixture
def task_text():
    torch.manual_seed(0)
    text = F.normalize(torch.randn(4, 16), dim=1)
    return torch.cat([text, text[:1]])  # 5 classes, rank 4 (a duplicated prompt)


def test_text_basis_is_orthonormal_and_spans_the_text_features(task_text):
    basis = text_subspace_basis(task_text)
    assert basis.shape == (16, 4)  # zero singular value dropped
    torch.testing.assert_close(basis.T @ basis, torch.eye(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(basis @ (basis.T @ task_text.T), task_text.T, atol=1e-5, rtol=0)


def test_orthogonal_projector_is_symmetric_idempotent_and_kills_the_text_span(task_text):
    basis = text_subspace_basis(task_text)
    projector = orthogonal_projector(basis)
    torch.testing.assert_close(projector, projector.T)
    torch.testing.assert_close(projector @ projector, projector, atol=1e-5, rtol=0)
    assert (projector @ task_text.T).abs().max() < 1e-5
    assert torch.linalg.matrix_rank(projector).item() == 16 - 4


def test_compensation_head_is_column_normalised_and_orthogonal_to_text(task_text):
    projector = orthogonal_projector(text_subspace_basis(task_text))
    weight = torch.randn(16, 5)
    head = compensation_head(weight, projector)
    torch.testing.assert_close(head.norm(dim=0), torch.ones(5))
    assert (task_text @ head).abs().max() < 1e-5  # W_hat^T t_c = 0 for every class of the task
    unconstrained = compensation_head(weight, None)
    torch.testing.assert_close(unconstrained, weight / weight.norm(dim=0))


def test_compensation_logits_eq5_and_loss_eq7():
    image = torch.tensor([[1.0, 0.0, 0.0]])
    head = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert compensation_logits(image, head).tolist() == [[0.0, 1.0]]
    # logits 100 * [0, 1], target 0 -> CE = log(1 + e^100) - 0 ~= 100
    assert compensation_loss(image, head, torch.tensor([0]), 100.0).item() == pytest.approx(100.0, abs=1e-4)


def test_prototypes_are_normalised_means_of_normalised_features():
    features = torch.tensor([[2.0, 0.0], [0.0, 3.0], [0.0, 1.0], [5.0, 5.0]])
    labels = torch.tensor([7, 7, 9, 9])
    prototypes = class_prototypes(features, labels, [9, 7])
    # class 7: mean([1,0],[0,1]) -> [.5,.5] -> normalised; class 9: mean([0,1],[.707,.707])
    s = math.sqrt(0.5)
    expected_9 = F.normalize(torch.tensor([s / 2, (1 + s) / 2]), dim=0)
    torch.testing.assert_close(prototypes, torch.stack([expected_9, torch.tensor([s, s])]))
    torch.testing.assert_close(prototype_score(torch.tensor([[1.0, 0.0]]), prototypes), prototypes[:, :1].T)


def test_unified_scores_compose_text_compensation_and_prototype_terms():
    image = torch.tensor([[1.0, 0.0]])
    text = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    head = torch.tensor([[0.5, -1.0], [0.0, 0.0]])  # g = [0.5, -1]
    prototypes = torch.tensor([[1.0, 0.0], [0.8, 0.6]])  # <v, p> = [1, 0.8]
    q = unified_scores(image, text, head, prototypes, beta=0.2, gamma=0.5)
    torch.testing.assert_close(q, torch.tensor([[0.6 + 0.1 + 0.5, 0.0 - 0.2 + 0.4]]))
    torch.testing.assert_close(unified_scores(image, text, None, None, 0.2, 0.5), torch.tensor([[0.6, 0.0]]))


def test_task_msp_and_threshold_accept_95_percent_of_held_out():
    scores = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]])
    torch.testing.assert_close(task_msp(scores), torch.tensor([0.75, 0.5]))
    msp = torch.linspace(0.01, 1.0, 100)
    omega = msp_threshold(msp, 5.0)
    assert omega == pytest.approx(np.percentile(msp.numpy(), 5.0))
    assert (msp > omega).float().mean().item() == pytest.approx(0.95)


def test_fusion_weights_and_fused_logits_eq8():
    r = torch.tensor([[0.0, math.log(3.0)]])  # two tasks -> alpha = [0.25, 0.75]
    alpha = fusion_weights(r)
    torch.testing.assert_close(alpha, torch.tensor([[0.25, 0.75]]))
    images = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [T=2, B=1, d=2]
    text = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    fused = fused_zero_shot_logits(images, text, alpha)
    torch.testing.assert_close(fused, torch.tensor([[0.25, 0.75, 0.25 * 0.6 + 0.75 * 0.8]]))


def test_confidence_and_margin_by_hand():
    # columns: classes of task 0 (cols 0, 1) and task 1 (col 2); one sample of class col 0
    q = torch.tensor([[2.0, 0.0, 1.5]], dtype=torch.float64)
    confidence, margin = _confidence_and_margin(
        q, torch.tensor([0]), torch.tensor([0]), torch.tensor([0, 0, 1])
    )
    assert confidence == pytest.approx(math.exp(2) / (math.exp(2) + 1))
    assert margin == pytest.approx(0.5)
    _, single = _confidence_and_margin(q[:, :2], torch.tensor([0]), torch.tensor([0]), torch.tensor([0, 0]))
    assert single is None


def test_subspace_distance_identities():
    e = torch.eye(4)
    assert directional_distance(e[:, :2], e[:, :2]) == pytest.approx(0.0)
    assert directional_distance(e[:, :2], e[:, 2:]) == pytest.approx(1.0)
    # source {e0, e1} onto target {e0}: residuals 0 and 1 -> 0.5; reverse direction: 0
    assert directional_distance(e[:, :2], e[:, :1]) == pytest.approx(0.5)
    assert directional_distance(e[:, :1], e[:, :2]) == pytest.approx(0.0)
    assert symmetric_distance(e[:, :2], e[:, :1]) == pytest.approx(0.25)
    joint = joint_basis(e[:, :1], F.normalize(torch.tensor([[1.0], [1.0], [0.0], [0.0]]), dim=0))
    assert joint.shape == (4, 2) and directional_distance(e[:, :2], joint) == pytest.approx(0.0, abs=1e-6)
    basis = orthonormal_basis(torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert basis.shape == (3, 2)


def test_energy_basis_keeps_95_percent_of_energy():
    # normalised features concentrated on e0 (energy 0.96) with a small e1 share
    features = torch.tensor([[1.0, 0.0]] * 24 + [[0.0, 1.0]])
    assert energy_basis(features, 0.95).shape == (2, 1)
    assert energy_basis(features, 0.99).shape == (2, 2)


def test_holdout_split_never_leaves_a_class_without_training_images():
    from strategies.methods.gr4cil import holdout_split

    targets = [0, 0, 0, 0, 1, 1, 1, 1, 2, 3]  # classes 2 and 3 have one image each
    order = [8, 0, 4, 9, 1, 2, 3, 5, 6, 7]
    # 40 % of 10: the first 4 of the order; images 8 and 9 are their classes' only ones
    held, trained = holdout_split(targets, order, 0.4)
    assert held == [8, 0, 4, 9]
    assert trained == [1, 2, 3, 5, 6, 7, 8, 9]
    assert {targets[i] for i in trained} == {0, 1, 2, 3}
    # with enough images a class, it is the plain split
    assert holdout_split([0, 0, 1, 1, 0, 1], [5, 0, 1, 2, 3, 4], 0.3) == ([5, 0], [1, 2, 3, 4])
