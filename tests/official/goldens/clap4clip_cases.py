"""The fixtures' cases of CLAP4CLIP's goldens and the suite's side of them: seeded inputs, the suite's
``CLAP`` built at the fixtures' width, and the names of its parameters in the official model. The
tests (``tests/official/test_clap*.py``) build the suite's side from here."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

DIM = 16  # the embedding width of these fixtures (the VGA's feed-forward stays the official 2048)


@dataclasses.dataclass(frozen=True)
class Case:
    """One official run: two tasks of ``task_sizes`` classes, a batch of task 2's images."""

    seed: int
    task_sizes: tuple[int, int]
    batch: int
    samples: int  # R (the official --forward-times, the suite's samples)
    templates: int  # M

    @property
    def classes(self) -> int:
        return sum(self.task_sizes)


ENCODERS = Case(seed=31, task_sizes=(3, 2), batch=4, samples=3, templates=4)


LOGITS = Case(seed=32, task_sizes=(2, 3), batch=5, samples=4, templates=5)


LASP = Case(seed=33, task_sizes=(2, 4), batch=3, samples=3, templates=18)  # CIFAR's 18 templates


def case_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Seeded inputs: normalised template features ``[C, M, d]`` (each class's templates spread
    around its own direction), raw image features ``[B, d]``, task 2's global labels, and the
    standard-normal noise of every ``rsample`` (evaluation, then training; one per task)."""
    g = torch.Generator().manual_seed(case.seed)
    centre = torch.randn(case.classes, 1, DIM, generator=g)
    templates = F.normalize(
        centre + 0.4 * torch.randn(case.classes, case.templates, DIM, generator=g), dim=-1
    )
    first, second = case.task_sizes
    tensors = {
        "input.templates": templates,
        "input.image": torch.randn(case.batch, DIM, generator=g),
        "input.labels": first + torch.randint(second, (case.batch,), generator=g),
    }
    for phase in ("eval", "train"):
        for task, size in enumerate(case.task_sizes):
            tensors[f"input.noise.{phase}.{task}"] = torch.randn(case.samples, size, DIM, generator=g)
    return tensors


def suite_config(samples: int, **options):
    """The suite's CLAP config for these fixtures: the official VGA context (D4) and no dropout."""
    from strategies.methods.clap import CLAP

    return CLAP.Config(samples=samples, vga_context="batch", vga_dropout=0.0, **options)


def suite_clap(case: Case, templates: torch.Tensor, seed: int | None = None):
    """The suite's CLAP at width ``DIM`` after ``setup_task`` of both tasks (classes 0..C-1 in
    order), its template features those given. The tiny CLIP's towers never run: the strategy
    reads the templates from its cache and gets image features directly."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.methods.clap import CLAP
    from strategies.settings import RunSettings

    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    backbone.embed_dim = DIM  # the width CLAP builds its VGA and encoders at
    if seed is not None:
        torch.manual_seed(seed)
    strategy = CLAP(
        backbone=backbone,
        class_names=[f"class {c}" for c in range(case.classes)],
        config=suite_config(case.samples),
        settings=RunSettings(show_progress=False),
    )
    strategy._templates = {c: templates[c] for c in range(case.classes)}
    first = list(range(case.task_sizes[0]))
    second = list(range(case.task_sizes[0], case.classes))
    strategy.current_classes = first
    strategy.setup_task(0, first)
    strategy.task_classes, strategy.seen_classes = [first], first
    strategy.current_classes = second
    strategy.setup_task(1, second)
    return strategy


def suite_parameters(strategy) -> dict[str, torch.Tensor]:
    """The VGA's and the encoders' tensors under the suite's names (``vga.*``, ``encoders.i.*``)."""
    return {
        **{f"vga.{k}": v for k, v in strategy.vga.state_dict().items()},
        **{f"encoders.{k}": v for k, v in strategy.encoders.state_dict().items()},
    }


def official_name(suite_name: str) -> str:
    """The official model's parameter name of a suite name: the VGA is a one-layer
    ``nn.TransformerDecoder``, each encoder a pair of ``Adapter``s (``fc`` = Sequential(Linear))."""
    head, rest = suite_name.split(".", 1)
    if head == "vga":
        return f"vga.layers.0.{rest}"
    task, kind, leaf = rest.split(".")
    return f"{kind}_adapters.{task}.fc.0.{leaf}"


def suite_name(official: str) -> str:
    if official.startswith("vga.layers.0."):
        return "vga." + official.removeprefix("vga.layers.0.")
    kind, task, _, _, leaf = official.split(".")
    return f"encoders.{task}.{kind.removesuffix('_adapters')}.{leaf}"
