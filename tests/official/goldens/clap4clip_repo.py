"""Golden outputs of CLAP4CLIP's official code (``srvCodes/clap4clip``, the suite's ``clap``).

The official ``ClClipVariational`` runs as ``clap4clip_official`` says, on the inputs of a case of
``clap4clip_cases``. Every parameter of the VGA and of both tasks' encoders is copied from the
suite's ``CLAP`` (built at the same width, its encoders initialised by its own language-aware rule,
then ``looks_trained``) right after the official ``init_model`` of task 2.

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

from pathlib import Path

import torch

from tests.official.goldens import component
from tests.official.goldens.clap4clip_cases import (
    DIM,
    ENCODERS,
    LASP,
    LOGITS,
    Case,
    case_inputs,
    suite_clap,
    suite_parameters,
)
from tests.official.goldens.clap4clip_official import (
    LOADING,
    OfficialRun,
    check_vga_structure,
    run_official,
)
from tests.official.goldens.golden import Golden, Official, looks_trained

OFFICIAL = Official(
    repository="srvCodes/clap4clip",
    commit="7ff95c2894c22ce141f8df06301bed9620a40bf7",
    folder="clap4clip",
)
FILE = "classifier/continual_clip_variational.py"
CIFAR_STEPS_PER_EPOCH = 157  # a CIFAR-100 task of 10 classes: 5000 images in batches of 32, the last short


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
    structure = check_vga_structure(checkout)
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
