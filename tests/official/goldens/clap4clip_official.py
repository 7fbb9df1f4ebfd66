"""CLAP4CLIP's official ``ClClipVariational`` run on a case's inputs, what it computes captured.

The official model (``classifier/continual_clip_variational.py``) has no separable function for the
visual-guided attention (VGA), the task encoders, the logits, the KL term or LASP: all of them are
computed inside ``CLIP.forward``, and the loss is combined inside ``ClClipVariational.fit``. So the
smallest official unit run here is ``ClClipVariational`` itself, driven as ``main_incremental_submit.py``
drives it: its arguments parsed by the official ``parse_option`` from the README's CLAP command line,
then ``fit`` on task 1 (no step: an empty loader), ``post_training``, and ``fit`` on task 2 with one
batch. CLIP is a stand-in (``_FeatureCLIP``): its text encoder returns the fixture's template
features and its visual tower returns the fixture's image features unchanged, so the frozen towers
are inputs. The suite's parameters are copied in right after the official ``init_model`` of task 2.
What the official run computes is captured without changing it: forward hooks (VGA, encoders,
model), the loss handed to ``backward``, the gradients at the first ``optimizer.step``, the learning
rate of every step. The noise of ``Normal.rsample`` is an input: torch's own ``rsample`` runs, with
its standard-normal draw replaced by the fixture's.
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
from torch import nn

from tests.official.goldens.clap4clip_cases import (
    DIM,
    ENCODERS,
    Case,
    case_inputs,
    official_name,
    suite_name,
)
from tests.official.goldens.golden import official_import_path, stub_module

# The README's command for CLAP4CLIP with hand-crafted prompts (the run behind docs/baselines.md §13).
README_COMMAND = (
    "--lasp --beta 15 --db_name cifar100 --use-vga --expandable-adapter --finetuning --finetune-epochs 2 "
    "--num-run 10 --compute-ece --compute-bwt --train_batch 32 --exemplar-selector random "
    "--root ../path_to_datasets/ --multi-gpu --gpus 0,1 --default-gpu 0 --model clclip_var --epochs 5 "
    "--forward-times 20 --arch ViT-B-16 --method er --variational"
).split()


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
        self.dtype = features.dtype  # OpenAI CLIP's dtype, which the official modules are cast to

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
        def rsample(self, sample_shape=torch.Size()):  # torch's own default
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


def check_vga_structure(checkout: Path) -> dict[str, object]:
    """The official VGA layer (built by ``ClClipVariational.__init__`` at the published settings)
    against the suite's CLAP VGA with its default config at the same width: every hyper-parameter
    equal, or the generator stops."""
    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.methods.clap import CLAP
    from strategies.settings import RunSettings

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
