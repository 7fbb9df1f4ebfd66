"""Subspace-distance metric of the GR4CIL appendix ("Details of subspace-distance metric").

``d(B_src, B_tgt) = mean_j || b_j - P_tgt b_j ||`` over the orthonormal source basis vectors, with
``P_tgt = B_tgt B_tgt^T``. It is directional: 0 when the target covers the source, 1 when the
two are orthogonal. All functions are pure (tensors in, tensors or floats out).
"""

from __future__ import annotations

import torch


def orthonormal_basis(vectors: torch.Tensor, rtol: float = 1e-5) -> torch.Tensor:
    """Orthonormal basis ``[d, r]`` of the span of the rows of ``vectors`` ``[n, d]``
    (SVD, numerical rank)."""
    _, s, vh = torch.linalg.svd(vectors.double(), full_matrices=False)
    rank = int((s > rtol * s.max()).sum()) if s.numel() else 0
    return vh[:rank].T.float()


def energy_basis(features: torch.Tensor, energy: float = 0.95) -> torch.Tensor:
    """Principal basis ``[d, r]`` of L2-normalised row features keeping ``energy`` of the squared
    singular values (the image basis ``B_i`` of the appendix)."""
    features = torch.nn.functional.normalize(features.double(), dim=1)
    _, s, vh = torch.linalg.svd(features, full_matrices=False)
    cumulative = torch.cumsum(s**2, 0) / (s**2).sum()
    rank = int(torch.searchsorted(cumulative, torch.tensor(energy, dtype=cumulative.dtype)).item()) + 1
    return vh[:rank].T.float()


def joint_basis(*bases: torch.Tensor) -> torch.Tensor:
    """Re-orthonormalised basis of the concatenation of several bases (``B_{t∪c}``)."""
    return orthonormal_basis(torch.cat(bases, dim=1).T)


def directional_distance(source: torch.Tensor, target: torch.Tensor) -> float:
    """``d(B_src, B_tgt)`` for orthonormal bases given as ``[d, r]`` columns."""
    residual = source - target @ (target.T @ source)
    return float(residual.norm(dim=0).mean())


def symmetric_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean of both directional distances (the adjacent-task distance of the appendix)."""
    return 0.5 * (directional_distance(a, b) + directional_distance(b, a))
