"""Golden outputs of CLAP4CLIP's official code (``srvCodes/clap4clip``, the suite's ``clap``).

The official model (``classifier/continual_clip_variational.py``) has no separable function for the
visual-guided attention (VGA), the task encoders, the logits, the KL term or LASP: all of them are
computed inside ``CLIP.forward``, and the loss is combined inside ``ClClipVariational.fit``. So the
smallest official unit run here is ``ClClipVariational`` itself, driven as ``main_incremental_submit.py``
drives it: its arguments parsed by the official ``parse_option`` from the README's CLAP command line,
then ``fit`` on task 1 (no step: an empty loader), ``post_training``, and ``fit`` on task 2 with one
batch. CLIP is a stand-in (``_FeatureCLIP``): its text encoder returns the fixture's template
features and its visual tower returns the fixture's image features unchanged, so the frozen towers
are inputs. Every parameter of the VGA and of both tasks' encoders is copied from the suite's
``CLAP`` (built at the same width, its encoders initialised by its own language-aware rule, then
``looks_trained``) right after the official ``init_model`` of task 2. What the official run computes
is captured without changing it: forward hooks (VGA, encoders, model), the loss handed to
``backward``, the gradients at the first ``optimizer.step``, the learning rate of every step.
The noise of ``Normal.rsample`` is an input: torch's own ``rsample`` runs, with its standard-normal
draw replaced by the fixture's.

Components:

* ``clap.encoders``: the official language-aware initial weights of both tasks' encoders, the
  task attention mask, t_c, the VGA output, each encoder's input, mu, sigma and sample z, and the
  gradients of a seeded linear functional of (VGA, mu, sigma, z) for every trainable tensor.
* ``clap.logits_kl``: the training logits over both tasks' classes, the weighted KL term
  (``prior_matching_loss``), the weighted LASP term, the loss ``fit`` backpropagates and its
  gradients; and the evaluation logits (``inference``, ``test=True``) on the same parameters.
* ``clap.lasp_schedule``: LASP at the published settings (18 templates, beta from the command
  line) on the official samples z, its gradient in z; and the learning rate of each of the 785
  steps of a CIFAR-100 task (5 epochs of 157 batches of 32), read from the optimiser at every
  official step of ``fit``.

Official settings that differ from the suite's defaults and are set in the tests (notes of each
fixture): ``vga_context = "batch"`` (D4: the official VGA attends over the whole batch);
``vga_dropout = 0`` on both sides (the official ``fit`` keeps the VGA in train mode, so its dropout
is random; the official layer's dropout probabilities are set to 0 here, after the structural check
that they, and every other hyper-parameter of the layer, equal the suite's defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.tools.official_goldens import component
from benchmarks.tools.official_goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)
from strategies.settings import RunSettings

OFFICIAL = Official(
    repository="srvCodes/clap4clip",
    commit="7ff95c2894c22ce141f8df06301bed9620a40bf7",
    folder="clap4clip",
)
FILE = "classifier/continual_clip_variational.py"
# The README's command for CLAP4CLIP with hand-crafted prompts (the run behind docs/baselines.md §13).
README_COMMAND = (
    "--lasp --beta 15 --db_name cifar100 --use-vga --expandable-adapter --finetuning --finetune-epochs 2 "
    "--num-run 10 --compute-ece --compute-bwt --train_batch 32 --exemplar-selector random "
    "--root ../path_to_datasets/ --multi-gpu --gpus 0,1 --default-gpu 0 --model clclip_var --epochs 5 "
    "--forward-times 20 --arch ViT-B-16 --method er --variational"
).split()
DIM = 16  # the embedding width of these fixtures (the VGA's feed-forward stays the official 2048)
CIFAR_STEPS_PER_EPOCH = 157  # a CIFAR-100 task of 10 classes: 5000 images in batches of 32, the last short


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
    from strategies.clap import CLAP

    return CLAP.Config(samples=samples, vga_context="batch", vga_dropout=0.0, **options)


def suite_clap(case: Case, templates: torch.Tensor, seed: int | None = None):
    """The suite's CLAP at width ``DIM`` after ``setup_task`` of both tasks (classes 0..C-1 in
    order), its template features those given. The tiny CLIP's towers never run: the strategy
    reads the templates from its cache and gets image features directly."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.clap import CLAP

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


# ---------------------------------------------------------------- the stand-ins
class _Visual(nn.Module):
    """CLIP's visual tower replaced: the images are the fixture's features. ``conv1`` only gives
    the official ``dtype`` property its float32."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _FeatureCLIP(nn.Module):
    """What ``ClClipVariational`` and ``CLIP`` read from OpenAI's CLIP, at width ``DIM``: the text
    encoder maps the stubbed tokens (rows of the prompt list) to the fixture's template features."""

    def __init__(self, features: torch.Tensor, logit_scale: float) -> None:
        super().__init__()
        self.visual = _Visual()
        self.transformer = nn.Identity()
        self.positional_embedding = nn.Parameter(torch.zeros(1, DIM))
        self.ln_final = nn.LayerNorm(DIM)
        self.text_projection = nn.Parameter(torch.eye(DIM))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(logit_scale)))
        self.register_buffer("features", features)
        self.dtype = torch.float32

    def encode_text(self, rows: torch.Tensor) -> torch.Tensor:
        return self.features[rows]


class _PromptRows:
    """The stubbed ``clip.clip.tokenize``: a prompt's row in the flattened template features."""

    def __init__(self, class_names: list[str], templates: list[str]) -> None:
        self.row = {
            t.format(name.replace("_", " ")): c * len(templates) + m
            for c, name in enumerate(class_names)
            for m, t in enumerate(templates)
        }

    def __call__(self, prompts: list[str]) -> torch.Tensor:
        return torch.tensor([self.row[p] for p in prompts])


class _Loader:
    """A train loader of ``steps`` copies of one batch ``(x, y, index)``; its dataset is as large
    as a batch of 32, so ``fit`` keeps its learning rate."""

    def __init__(self, batch: tuple[torch.Tensor, ...], steps: int) -> None:
        self.batch, self.steps = batch, steps
        self.dataset = range(32 * max(1, steps))

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return iter([self.batch] * self.steps)


@contextlib.contextmanager
def _cuda_is_the_cpu() -> Iterator[None]:
    """The official code moves everything with ``.cuda(device=...)``: here those calls stay on the CPU."""
    saved = torch.Tensor.cuda, nn.Module.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda, nn.Module.cuda = saved


def _supplied_noise_normal(normal: type, queue: list[torch.Tensor], samples: list[torch.Tensor]) -> type:
    """``Normal`` whose ``rsample`` takes its standard-normal draw from ``queue`` (then fresh draws):
    torch's own ``rsample`` runs, only ``_standard_normal`` returns the given noise."""

    class SuppliedNoiseNormal(normal):
        def rsample(self, sample_shape=torch.Size()):  # noqa: B008 (torch's own default)
            if not queue:
                return super().rsample(sample_shape)
            eps = queue.pop(0)
            shape = self._extended_shape(sample_shape)
            if tuple(eps.shape) != tuple(shape):
                raise RuntimeError(f"noise {tuple(eps.shape)} given for an rsample of {tuple(shape)}")
            with mock.patch("torch.distributions.normal._standard_normal", lambda *a, **k: eps.clone()):
                sample = super().rsample(sample_shape)
            samples.append(sample)
            return sample

    return SuppliedNoiseNormal


def _stubs() -> dict[str, types.ModuleType]:
    """Modules the official files import for what these components never run: OpenAI's CLIP loader
    and tokenizer (replaced after import), the datasets and exemplar selection, the result printers,
    the other classifiers of ``main_incremental_submit.py`` and torchmetrics' calibration error."""
    clip = stub_module("clip")
    clip_clip = stub_module("clip.clip", load=None, tokenize=None)
    tokenizer = stub_module("clip.simple_tokenizer", SimpleTokenizer=type("SimpleTokenizer", (), {}))
    clip.clip, clip.simple_tokenizer = clip_clip, tokenizer
    dataset = stub_module("dataset")
    utils = stub_module("utils", mkdir_p=lambda path: None)
    stubs = {
        "clip": clip,
        "clip.clip": clip_clip,
        "clip.simple_tokenizer": tokenizer,
        "dataset": dataset,
        "dataset.incremental_dataloader": stub_module("dataset.incremental_dataloader"),
        "dataset.exemplars_selection": stub_module("dataset.exemplars_selection"),
        "utils": utils,
        "utils.display_results": stub_module("utils.display_results", get_measures=None, print_measures=None),
        "utils.rotation_angle_matrix": stub_module("utils.rotation_angle_matrix", RotationAngleMatrix=None),
        "torchmetrics": stub_module("torchmetrics"),
        "torchmetrics.classification": stub_module(
            "torchmetrics.classification", MulticlassCalibrationError=None
        ),
    }
    for name in ("zero_shot", "clip_adapter", "coop_variational", "coop_adapter", "maple_variational"):
        stubs[f"classifier.{name}"] = stub_module(
            f"classifier.{name}",
            ZeroshotCLIP=None,
            ClipAdapter=None,
            CoOpVariational=None,
            CoOpAdapter=None,
            MaPLe_var=None,
        )
    return stubs


LOADING = (
    "classifier/continual_clip_variational.py and main_incremental_submit.py imported from the checkout "
    "with stubs for what these components never run: clip.clip (load, tokenize) and "
    "clip.simple_tokenizer (OpenAI's CLIP: replaced by a stand-in CLIP whose text encoder returns the "
    "fixture's template features and whose visual tower passes the fixture's image features through), "
    "dataset.incremental_dataloader and dataset.exemplars_selection, utils (mkdir_p), "
    "utils.display_results, utils.rotation_angle_matrix, torchmetrics.classification, and the other "
    "classifiers main_incremental_submit imports; every .cuda(...) call is the identity (CPU run); "
    "Normal in the official module is torch's Normal with the standard-normal draw of rsample taken "
    "from the fixture's noise; arguments from the official parse_option on the README's CLAP command "
    "line, with --forward-times set to the case's R"
)


@contextlib.contextmanager
def official_variational(
    checkout: Path,
    forward_times: int,
    class_names: list[str],
    templates: list[str],
    features: torch.Tensor,
    logit_scale: float,
    queue: list[torch.Tensor],
    samples: list[torch.Tensor],
) -> Iterator[tuple[types.SimpleNamespace, nn.Module]]:
    """The official ``ClClipVariational`` at session 0 and its arguments, built as
    ``main_incremental_submit.py`` builds it from the README's command (``--forward-times``
    ``forward_times``) on ``_FeatureCLIP(features)``, prompts as rows of ``class_names`` x
    ``templates``, ``rsample`` drawing from ``queue`` (into ``samples``); while it is open the
    official modules are importable, ``.cuda()`` is the CPU and prints and warnings are silenced."""
    with (
        official_import_path(checkout, _stubs()) as load,
        _cuda_is_the_cpu(),
        mock.patch.object(sys, "argv", ["main_incremental_submit.py", *README_COMMAND]),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        main = load("main_incremental_submit.py", "main_incremental_submit")
        args = main.parse_option()
        args.forward_times = forward_times
        variational = sys.modules["classifier.continual_clip_variational"]
        variational.Normal = _supplied_noise_normal(variational.Normal, queue, samples)
        variational.tokenize = _PromptRows(class_names, templates)
        variational.load = lambda *a, **k: (_FeatureCLIP(features, logit_scale), None)
        args.sess = 0
        yield args, variational.ClClipVariational(args)


@dataclasses.dataclass
class OfficialRun:
    """What the official code computed on task 2, captured while it ran."""

    args: types.SimpleNamespace
    init: list[tuple[torch.Tensor, torch.Tensor]]  # language-aware (W_mu, W_sigma) of each task
    text: torch.Tensor  # t_c
    mask: torch.Tensor
    eval_logits: torch.Tensor
    vga: torch.Tensor
    encoder_inputs: list[torch.Tensor]
    mu: list[torch.Tensor]
    sigma: list[torch.Tensor]
    z: list[torch.Tensor]
    logits: torch.Tensor
    lasp_term: torch.Tensor
    kl_term: torch.Tensor
    loss: torch.Tensor
    loss_grads: dict[str, torch.Tensor]  # suite names
    functional_grads: dict[str, torch.Tensor]
    z_grad: torch.Tensor  # d lasp_term / d z of the current task
    step_lrs: list[float]
    vga_layer: nn.Module
    logit_scale: float  # CLIP's, exp() of its logit_scale parameter as the official forward takes it


def run_official(
    checkout: Path,
    case: Case,
    inputs: dict[str, torch.Tensor],
    params: dict[str, torch.Tensor],
    logit_scale: float,
    cotangents: dict[str, torch.Tensor] | None = None,
    steps_per_epoch: int = 1,
) -> OfficialRun:
    """Tasks 1 and 2 of the official ``ClClipVariational`` on the case's inputs, the suite's
    ``params`` copied in after task 2's ``init_model``; see the module docstring."""
    names = [f"class_{c}" for c in range(case.classes)]
    template_strings = [f"template {m} of a {{}}." for m in range(case.templates)]
    first, second = case.task_sizes
    queue = [inputs[f"input.noise.{p}.{t}"] for p in ("eval", "train") for t in range(2)]
    samples: list[torch.Tensor] = []
    captured: dict = {"init": [], "step_lrs": [], "masks": []}
    hooks: list = []
    features = inputs["input.templates"].reshape(-1, DIM)

    with official_variational(
        checkout, case.samples, names, template_strings, features, logit_scale, queue, samples
    ) as (args, official):
        layer = official.vga.layers[0]
        init_model = official.init_model

        def traced_init_model(class_names, per_epoch_steps, prompt_templates=None):
            init_model(class_names, per_epoch_steps, prompt_templates)
            model = official.model
            captured["init"].append(
                (
                    official.mu_adapters[-1].fc[0].weight.clone(),
                    official.sigma_adapters[-1].fc[0].weight.clone(),
                )
            )
            if args.sess != 1:
                return
            for module in layer.modules():  # dropout off (the VGA stays in train mode in fit)
                if isinstance(module, nn.Dropout):
                    module.p = 0.0
                if isinstance(module, nn.MultiheadAttention):
                    module.dropout = 0.0
            official_params = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in params.items():
                    official_params[official_name(name)].copy_(value)
            captured["text"] = model.frozen_text_features.clone()
            captured["eval_logits"], _ = official.inference(
                inputs["input.image"], inputs["input.labels"], None, None
            )
            get_mask = model.get_attention_mask
            model.get_attention_mask = lambda *a: (
                captured["masks"].append(get_mask(*a)) or captured["masks"][-1]
            )
            _capture_forward(model, captured, hooks)
            optimizer_step = official.optimizer.step

            def step(*a, **k):
                if "loss_grads" not in captured:
                    captured["loss_grads"] = {
                        suite_name(n): p.grad.clone()
                        for n, p in model.named_parameters()
                        if p.requires_grad and p.grad is not None
                    }
                    captured["trainable"] = {
                        suite_name(n) for n, p in model.named_parameters() if p.requires_grad
                    }
                captured["step_lrs"].append(official.optimizer.param_groups[0]["lr"])
                return optimizer_step(*a, **k)

            official.optimizer.step = step

        official.init_model = traced_init_model
        task1 = {
            "train_loader": _Loader((), 0),
            "class_names": names[:first],
            "prompt_templates": template_strings,
        }
        official.fit(task1)
        official.post_training(finalize=False)
        official.post_training(finalize=True)

        args.sess = 1
        batch = (inputs["input.image"], inputs["input.labels"], torch.arange(case.batch))
        task2 = {
            "train_loader": _Loader(batch, steps_per_epoch),
            "class_names": names[first:],
            "prompt_templates": template_strings,
        }
        backward = torch.Tensor.backward

        def traced_backward(tensor, *a, **k):
            if "loss" not in captured:
                captured["loss"] = tensor.detach().clone()
                z = samples[2:4]  # the training samples of tasks 1 and 2
                captured["z_grad"] = torch.autograd.grad(captured["lasp_term"], z[1], retain_graph=True)[0]
                if cotangents is not None:
                    captured["functional_grads"] = _functional_grads(official.model, captured, z, cotangents)
            return backward(tensor, *a, **k)

        with mock.patch.object(torch.Tensor, "backward", traced_backward):
            official.fit(task2)
        for hook in hooks:
            hook.remove()

    z = [s.detach() for s in samples[2:4]]
    if captured["trainable"] != {n for n in params if not n.startswith("encoders.0.")}:
        raise RuntimeError(f"official trainable tensors differ: {sorted(captured['trainable'])}")
    return OfficialRun(
        args=args,
        init=captured["init"],
        text=captured["text"],
        mask=captured["masks"][0],
        eval_logits=captured["eval_logits"],
        vga=captured["vga"].squeeze(0),
        encoder_inputs=captured["encoder_inputs"],
        mu=captured["mu"],
        sigma=captured["sigma"],
        z=z,
        logits=captured["logits"],
        lasp_term=captured["lasp_term"].detach(),
        kl_term=captured["kl_term"].detach(),
        loss=captured["loss"],
        loss_grads=captured["loss_grads"],
        functional_grads=captured.get("functional_grads", {}),
        z_grad=captured["z_grad"],
        step_lrs=captured["step_lrs"],
        vga_layer=layer,
        logit_scale=logit_scale,
    )


def _capture_forward(model: nn.Module, captured: dict, hooks: list) -> None:
    """Forward hooks on the model's first training forward: the VGA's output, each encoder's input
    and output, and the model's logits and loss terms (kept in the graph for the gradients)."""
    captured.update(encoder_inputs=[], mu=[], sigma=[])

    def first(key):
        def hook(module, args, output):
            if key not in captured:
                captured[key] = output

        return hook

    def adapter(kind, task):
        def hook(module, args, output):
            if len(captured[kind]) == task:
                captured[kind].append(output)
                if kind == "mu":
                    captured["encoder_inputs"].append(args[0].detach().clone())

        return hook

    def model_hook(module, args, output):
        if "logits" not in captured:
            logits, (lasp_term, kl_term, _) = output
            captured.update(logits=logits.detach().clone(), lasp_term=lasp_term, kl_term=kl_term)

    hooks.append(model.vga.register_forward_hook(first("vga")))
    for task, (mu, sigma) in enumerate(zip(model.mu_adapters, model.sigma_adapters, strict=True)):
        hooks.append(mu.register_forward_hook(adapter("mu", task)))
        hooks.append(sigma.register_forward_hook(adapter("sigma", task)))
    hooks.append(model.register_forward_hook(model_hook))


def _functional_grads(model, captured, z, cotangents) -> dict[str, torch.Tensor]:
    """Gradients of sum <cotangent, output> over the VGA output and each task's mu, sigma and z."""
    terms = [(cotangents["input.cotangent.vga"] * captured["vga"].squeeze(0)).sum()]
    for task in range(2):
        for kind, tensor in (
            ("mu", captured["mu"][task]),
            ("sigma", captured["sigma"][task]),
            ("z", z[task]),
        ):
            terms.append((cotangents[f"input.cotangent.{kind}.{task}"] * tensor).sum())
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(sum(terms), [p for _, p in trainable], retain_graph=True)
    return {suite_name(n): g.clone() for (n, _), g in zip(trainable, grads, strict=True)}


def _structure(layer: nn.Module) -> dict[str, object]:
    """The hyper-parameters of a ``nn.TransformerDecoderLayer``."""
    return {
        "d_model": layer.self_attn.embed_dim,
        "heads": layer.self_attn.num_heads,
        "feedforward": layer.linear1.out_features,
        "dropout": [layer.dropout.p, layer.dropout1.p, layer.dropout2.p, layer.dropout3.p],
        "attention_dropout": [layer.self_attn.dropout, layer.multihead_attn.dropout],
        "activation": getattr(layer.activation, "__name__", type(layer.activation).__name__),
        "norm_first": layer.norm_first,
        "batch_first": layer.self_attn.batch_first,
        "eps": layer.norm1.eps,
    }


def _check_vga_structure(checkout: Path) -> dict[str, object]:
    """The official VGA layer (built by ``ClClipVariational.__init__`` at the published settings)
    against the suite's CLAP VGA with its default config at the same width: every hyper-parameter
    equal, or the generator stops."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.clap import CLAP

    inputs = case_inputs(ENCODERS)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    backbone.embed_dim = DIM
    suite = CLAP(
        backbone=backbone, class_names=["a"], config=CLAP.Config(), settings=RunSettings(show_progress=False)
    )
    with (
        official_import_path(checkout, _stubs()) as load,
        _cuda_is_the_cpu(),
        mock.patch.object(sys, "argv", ["main_incremental_submit.py", *README_COMMAND]),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        main = load("main_incremental_submit.py", "main_incremental_submit")
        args = main.parse_option()
        variational = sys.modules["classifier.continual_clip_variational"]
        features = inputs["input.templates"].reshape(-1, DIM)
        variational.load = lambda *a, **k: (_FeatureCLIP(features, 1.0), None)
        official = variational.ClClipVariational(args)
        if len(official.vga.layers) != 1 or official.vga.norm is not None:
            raise RuntimeError("the official VGA is not one decoder layer without a final norm")
        theirs, ours = _structure(official.vga.layers[0]), _structure(suite.vga)
    if theirs != ours:
        raise RuntimeError(f"VGA hyper-parameters differ: official {theirs}, suite {ours}")
    return theirs


def _official_case(checkout: Path, case: Case, with_cotangents: bool = False, steps_per_epoch: int = 1):
    """Inputs, the suite's parameters (language-aware init, then ``looks_trained``), the official run."""
    inputs = case_inputs(case)
    strategy = suite_clap(case, inputs["input.templates"], seed=case.seed)
    g = torch.Generator().manual_seed(case.seed + 100)
    looks_trained(strategy.vga, g)
    looks_trained(strategy.encoders, g)
    params = {k: v.detach().clone() for k, v in suite_parameters(strategy).items()}
    cotangents = {}
    if with_cotangents:
        cotangents["input.cotangent.vga"] = torch.randn(case.classes, DIM, generator=g)
        for task, size in enumerate(case.task_sizes):
            for kind in ("mu", "sigma"):
                cotangents[f"input.cotangent.{kind}.{task}"] = torch.randn(size, DIM, generator=g)
            cotangents[f"input.cotangent.z.{task}"] = torch.randn(case.samples, size, DIM, generator=g)
    run = run_official(
        checkout,
        case,
        inputs,
        params,
        strategy.backbone.logit_scale,
        cotangents or None,
        steps_per_epoch,
    )
    return inputs, params, cotangents, run, strategy


def _sizes(case: Case, run: OfficialRun) -> dict[str, int]:
    return {
        "dim": DIM,
        "task_1_classes": case.task_sizes[0],
        "task_2_classes": case.task_sizes[1],
        "batch": case.batch,
        "samples": case.samples,
        "templates": case.templates,
        "vga_feedforward": run.vga_layer.linear1.out_features,
        "vga_heads": run.vga_layer.self_attn.num_heads,
    }


SETTINGS = (
    "Suite options that restore the official behaviour: vga_context='batch' (D4; the suite's default "
    "'image' attends per image) and vga_dropout=0.0 (the official fit keeps the VGA in train mode: the "
    "official layer's dropout, 0.1 like the suite's default, is set to 0 so that both sides are "
    "deterministic). Both sides run float32 (official: CLIP's fp16 on a GPU). Width {dim} (the "
    "feed-forward keeps the official 2048); R = {samples} samples instead of the published 20. "
    "Parameters: the suite's CLAP (torch's init for the VGA, its language-aware init for the encoders) "
    "plus looks_trained(0.05), copied into the official VGA (vga.layers.0.*) and Adapters "
    "(mu_adapters.i.fc.0.*, sigma_adapters.i.fc.0.*) after task 2's init_model."
)


@component("clap.encoders", OFFICIAL)
def encoders(checkout: Path) -> Golden:
    case = ENCODERS
    structure = _check_vga_structure(checkout)
    inputs, params, cotangents, run, _ = _official_case(checkout, case, with_cotangents=True)
    tensors = {**inputs, **cotangents, **{f"param.{k}": v for k, v in params.items()}}
    for task, (w_mu, w_sigma) in enumerate(run.init):
        tensors[f"output.init.mu_weight.{task}"] = w_mu
        tensors[f"output.init.sigma_weight.{task}"] = w_sigma
    tensors["output.text"] = run.text
    tensors["output.mask"] = run.mask
    tensors["output.vga"] = run.vga
    for task in range(2):
        tensors[f"output.encoder_input.{task}"] = run.encoder_inputs[task]
        tensors[f"output.mu.{task}"] = run.mu[task]
        tensors[f"output.sigma.{task}"] = run.sigma[task]
        tensors[f"output.z.{task}"] = run.z[task]
    tensors.update({f"grad.{k}": v for k, v in run.functional_grads.items()})
    return Golden(
        component="clap.encoders",
        official=OFFICIAL,
        file=FILE,
        function="ClClipVariational.fit (task 2, first step) -> CLIP.forward: get_attention_mask, vga, "
        "get_variational_adapter_features, Normal.rsample; CLIP.init_new_heads for the initial weights",
        loading=LOADING,
        seed=case.seed,
        sizes=_sizes(case, run),
        tensors=tensors,
        notes=(
            SETTINGS.format(dim=DIM, samples=case.samples)
            + " The official VGA layer's hyper-parameters equal the suite's defaults at the same width "
            f"(checked when generated): {structure}. output.init.*: the official language-aware weights "
            "of each task's encoders (W_mu, W_sigma), before the suite's parameters were copied in. "
            "grad.*: gradients of sum(cotangent.vga * vga) + sum over tasks and mu, sigma, z of "
            "sum(cotangent * tensor), for every tensor the official optimiser trains at task 2 (the VGA "
            "and task 2's encoders; task 1's are frozen)."
        ),
    )


@component("clap.logits_kl", OFFICIAL)
def logits_kl(checkout: Path) -> Golden:
    case = LOGITS
    inputs, params, _, run, _ = _official_case(checkout, case)
    tensors = {**inputs, **{f"param.{k}": v for k, v in params.items()}}
    tensors.update(
        {
            "input.logit_scale": torch.tensor(run.logit_scale),
            "output.logits": run.logits,
            "output.kl_term": run.kl_term,
            "output.lasp_term": run.lasp_term,
            "output.loss": run.loss,
            "output.eval_logits": run.eval_logits,
            **{f"grad.{k}": v for k, v in run.loss_grads.items()},
        }
    )
    return Golden(
        component="clap.logits_kl",
        official=OFFICIAL,
        file=FILE,
        function="ClClipVariational.fit (task 2, first step: CLIP.forward, then the loss "
        "F.cross_entropy(output, targets) + kl_loss + prior_matching_loss and its backward); "
        "ClClipVariational.inference (CLIP.forward, test=True) for the evaluation logits",
        loading=LOADING,
        seed=case.seed,
        sizes={**_sizes(case, run), "beta": int(run.args.beta), "lasp": int(run.args.lasp)},
        tensors=tensors,
        notes=(
            SETTINGS.format(dim=DIM, samples=case.samples)
            + " output.logits: [R, B, C] over both tasks' classes (logit_scale.exp() * v @ (t + vga + z)^T). "
            "output.kl_term: the official prior_matching_loss, 0.001 * KL(q_2 || N(0, I)).mean(0).sum() "
            "for task 2's encoder only (the NP prior is off). output.lasp_term: the official kl_loss, "
            "beta * LASP of task 2 (beta = 15 from the command line). output.loss: the tensor fit "
            "backpropagates. grad.*: its gradients for every tensor the official optimiser trains. "
            "output.eval_logits: inference() on the same parameters and the eval noise, before training "
            "(the VGA over the batch, as D4 says)."
        ),
    )


@component("clap.lasp_schedule", OFFICIAL)
def lasp_schedule(checkout: Path) -> Golden:
    case = LASP
    inputs, _, _, run, _ = _official_case(checkout, case, steps_per_epoch=CIFAR_STEPS_PER_EPOCH)
    second = list(range(case.task_sizes[0], case.classes))
    epochs = int(run.args.epochs)
    if len(run.step_lrs) != epochs * CIFAR_STEPS_PER_EPOCH:
        raise RuntimeError(f"{len(run.step_lrs)} official steps, not {epochs * CIFAR_STEPS_PER_EPOCH}")
    tensors = {
        "input.templates": inputs["input.templates"][second],
        "input.z": run.z[1],
        "output.lasp_term": run.lasp_term,
        "grad.z": run.z_grad,
        "output.lr": torch.tensor(run.step_lrs),
    }
    return Golden(
        component="clap.lasp_schedule",
        official=OFFICIAL,
        file=FILE,
        function="CLIP.forward (training, task 2: the LASP term kl_loss) and ClClipVariational.fit "
        "(build_optimizer -> classifier/utils.py build_cosine_scheduler, stepped by fit)",
        loading=LOADING,
        seed=case.seed,
        sizes={
            "dim": DIM,
            "classes": case.task_sizes[1],
            "templates": case.templates,
            "samples": case.samples,
            "beta": int(run.args.beta),
            "lasp": int(run.args.lasp),
            "epochs": epochs,
            "steps_per_epoch": CIFAR_STEPS_PER_EPOCH,
            "train_batch": int(run.args.train_batch),
        },
        tensors=tensors,
        notes=(
            "LASP is on at the published settings (--lasp --beta 15): output.lasp_term is the official "
            "kl_loss of task 2's training forward, beta * CE(S, 0..C-1), S the mean over samples and "
            f"templates of F_k z_r^T; input.z the official samples of task 2 (R = {case.samples}) and "
            "input.templates task 2's normalised template features (18 templates, the CIFAR ensemble's "
            "size); grad.z = d lasp_term / d z. output.lr: the learning rate the official optimiser held "
            f"at each of the {epochs} x {CIFAR_STEPS_PER_EPOCH} SGD steps of a CIFAR-100 task's fit "
            "(a numpy float64 array officially, stored in float32), base lr = "
            "args.lr * train_batch / 20 = 1.6e-3."
        ),
    )
