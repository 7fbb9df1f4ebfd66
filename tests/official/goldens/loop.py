"""What the training-loop goldens share (issue 52): seeded batches, the record of every optimiser
step, and a fingerprint of each trainable tensor small enough to store after every step.

A loop golden runs an official training function and the suite's strategy from identical
parameters on identical batches in identical order and records, after every optimiser step, the
loss, the learning rate of every parameter group and a fingerprint of every trainable tensor;
after every task, scores on fixed test images. The fingerprint of a tensor ``t`` with initial
value ``t0`` is taken of its change ``d = t - t0`` (so rounding of the large initial value does not
hide a difference of the step): ``[sum d, |d|, <d, r>, d[i_1..i_8]]`` with ``r`` a standard normal
vector and ``i_k`` positions, both seeded by the tensor's name. A difference in any entry moves
``<d, r>``; one of the learning rate, a weight decay or a loss weight moves them all.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from strategies.settings import RunSettings
from tests.official.goldens.golden import Golden

N_ENTRIES = 8  # sampled entries of each tensor's change in a fingerprint
# The split the CLIP loop goldens share (APER, MagMax, MG-CLIP, MoE): two tasks of three classes,
# fixed test images, inputs drawn from one seed.
SEED = 0
TASKS = ((0, 1, 2), (3, 4, 5))
N_TEST = 6
FINGERPRINT = ("sum", "norm", "projection", *(f"entry{i}" for i in range(N_ENTRIES)))


def fingerprint(name: str, tensor: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """The fingerprint (``FINGERPRINT``, float64) of ``tensor``'s change from ``initial``."""
    d = (tensor.detach().double().cpu() - initial.detach().double().cpu()).flatten()
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    r = torch.randn(d.numel(), generator=generator, dtype=torch.float64)
    entries = torch.randint(d.numel(), (N_ENTRIES,), generator=generator)
    return torch.cat([torch.stack([d.sum(), d.norm(), d @ r]), d[entries]])


def fingerprints(named: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: fingerprint(name, t, initial[name]) for name, t in named.items()}


def seeded_batches(
    generator: torch.Generator, classes: list[int], steps: int, batch: int, image_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``batch`` standard normal images (already normalised pixels, as a
    loader hands them over) and labels drawn from ``classes`` (global class ids)."""
    out = []
    for _ in range(steps):
        x = torch.randn(batch, 3, image_size, image_size, generator=generator)
        y = torch.tensor(classes)[torch.randint(len(classes), (batch,), generator=generator)]
        out.append((x, y))
    return out


def loop_inputs(image_size: int, steps: int, batch: int) -> dict[str, torch.Tensor]:
    """``steps`` seeded batches of ``batch`` for each of ``TASKS`` (``input.task{t}.x{s}``/``y{s}``),
    then ``N_TEST`` fixed test images (``input.test_x``), all from one generator seeded ``SEED``."""
    generator = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    for t, classes in enumerate(TASKS):
        for s, (x, y) in enumerate(seeded_batches(generator, list(classes), steps, batch, image_size)):
            tensors[f"input.task{t}.x{s}"], tensors[f"input.task{t}.y{s}"] = x, y
    tensors["input.test_x"] = torch.randn(N_TEST, 3, image_size, image_size, generator=generator)
    return tensors


def in_float64(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A fixture's float32 inputs (images, features, noise) as a loop run in float64 reads them. Every
    loop golden runs both sides in float64: float32 rounding, carried through the optimiser, differs
    between CPUs by about as much as a perturbation moves (docs/baselines.md §16)."""
    floats = {k for k, v in tensors.items() if k.startswith("input.") and v.is_floating_point()}
    return {k: v.double() if k in floats else v for k, v in tensors.items()}


@contextlib.contextmanager
def default_float64() -> Iterator[None]:
    """torch's default dtype float64 while open: what a float64 loop's code creates (an official
    head's bias, a strategy's new modules) is float64 too."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def float64_golden(stored: dict[str, torch.Tensor], run: Callable[[dict], Golden]) -> Golden:
    """``run(inputs)`` with torch's default dtype float64 and ``stored`` (float32 inputs, kept so in
    the fixture) read in float64; the golden it returns holds ``stored`` as they are."""
    with default_float64():
        golden = run(in_float64(stored))
    golden.tensors.update(stored)
    return golden


def tiny_clip_strategy(cls, config, float64: bool = False):
    """``cls`` on the suite's tiny CLIP with a class for each of ``TASKS``' ids, seeded ``SEED``;
    ``float64``: the tiny CLIP cast to float64, as the loop goldens run it (open_clip builds it in
    float32 whatever torch's default dtype)."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip

    strategy = cls(
        backbone=create_clip(BackboneSpec(TINY_MODEL, "synthetic")),
        class_names=[f"class{i}" for i in range(max(max(t) for t in TASKS) + 1)],
        config=config,
        settings=RunSettings(show_progress=False, seed=SEED),
    )
    if float64:
        strategy.backbone.to(torch.float64)
    return strategy


class StepRecord:
    """The steps of one training run: ``losses``, ``lrs`` (each group's lr as the step used it) and
    ``prints`` (fingerprints by name), one entry a step, in order."""

    def __init__(self, names: Callable[[], dict[str, torch.Tensor]], initial: dict[str, torch.Tensor]):
        self.names, self.initial = names, initial
        self.losses: list[float] = []
        self.lrs: list[list[float]] = []
        self.prints: list[dict[str, torch.Tensor]] = []

    def step(self, loss: float, lrs: list[float]) -> None:
        self.losses.append(float(loss))
        self.lrs.append([float(lr) for lr in lrs])
        self.prints.append(fingerprints(self.names(), self.initial))

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """The record as fixture tensors: ``{prefix}step{s}.loss|lr|fp.<name>``."""
        out: dict[str, torch.Tensor] = {}
        for s, (loss, lrs, prints) in enumerate(zip(self.losses, self.lrs, self.prints, strict=True)):
            out[f"{prefix}step{s}.loss"] = torch.tensor(loss, dtype=torch.float64)
            out[f"{prefix}step{s}.lr"] = torch.tensor(lrs, dtype=torch.float64)
            out.update({f"{prefix}step{s}.fp.{n}": fp for n, fp in prints.items()})
        return out


@contextlib.contextmanager
def on_every_optimizer_step(hook: Callable[[torch.optim.Optimizer], None]) -> Iterator[None]:
    """Call ``hook(optimizer)`` after every ``optimizer.step()`` of any optimiser (torch's global
    post hook): the official loops build their optimisers inside the function that is run."""
    handle = register_optimizer_step_post_hook(lambda opt, *_: hook(opt))
    try:
        yield
    finally:
        handle.remove()


class StaysOnHost(torch.Tensor):
    """A tensor whose ``.to(...)``/``.cuda()`` return itself as a plain tensor on the CPU: an
    official loop's ``inputs.to('cuda:0')`` runs on a machine without one, nothing else changes."""

    def to(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)

    def cuda(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def on_host(t: torch.Tensor) -> torch.Tensor:
    return t.clone().as_subclass(StaysOnHost)
