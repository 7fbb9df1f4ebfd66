"""CLAP against CLAP4CLIP's official code, by execution: the fixtures of
``tests/official/goldens/clap4clip_repo.py`` (the official ``ClClipVariational`` run on
seeded features with the suite's parameters) fed to the suite's ``CLAP``, configured as the official
code runs (``vga_context = "batch"``, D4; VGA dropout 0 on both sides, the fixtures' notes)."""

import pytest
import torch
import torch.nn.functional as F

from strategies.methods.clap import CLAP, CLAPOutput, kl_to_standard_normal, lasp_loss, task_mask
from strategies.optim import build_optimizer, build_scheduler
from tests.official.goldens.clap4clip_cases import ENCODERS, LASP, LOGITS, Case, suite_clap
from tests.official.goldens.golden import load_golden
from tests.official.helpers import close

ATOL = 5e-6  # float32 rounding; features, VGA outputs, mu, sigma and z are O(1) (seen: 4e-7)
INIT_ATOL = 1e-7  # float32 rounding of E^T E / d and V^T V / d, entries below 0.04 (seen: 4e-9)
GRAD_ATOL = 1e-4  # float32 rounding through a backward over the 2048-wide feed-forward; grads O(1-70)
# (seen: 2e-5)
LOGIT_ATOL = 1e-3  # logits are s <v, t + vga + z> with s = 90: values up to ~390 (seen: 8e-5)
LOSS_ATOL = 5e-4  # the loss is ~230 (cross-entropy of those logits); float32 rounding (seen: 0)
LASP_ATOL = 1e-5  # 15 * a cross-entropy of ~1; float32 rounding (seen: 2e-6)
KL_ATOL = 1e-8  # 0.001 * KL, ~3e-3; float32 rounding (seen: 2e-10)
LR_RTOL = 1e-6  # the official lr is a float64 numpy value, stored in float32 (relative 6e-8)


def _strategy(case: Case, tensors: dict[str, torch.Tensor]) -> CLAP:
    """The suite's CLAP after both tasks' ``setup_task``, with the fixture's parameters."""
    strategy = suite_clap(case, tensors["input.templates"])
    strategy.vga.load_state_dict(
        {k.removeprefix("param.vga."): v for k, v in tensors.items() if k.startswith("param.vga.")}
    )
    strategy.encoders.load_state_dict(
        {k.removeprefix("param.encoders."): v for k, v in tensors.items() if k.startswith("param.encoders.")}
    )
    return strategy


def _tasks(case: Case) -> list[list[int]]:
    return [list(range(case.task_sizes[0])), list(range(case.task_sizes[0], case.classes))]


def _noise(tensors, phase: str) -> list[torch.Tensor]:
    """The fixture's noise per task as ``sample_logits`` takes it: ``[R, 1, C_i, d]``."""
    return [tensors[f"input.noise.{phase}.{task}"].unsqueeze(1) for task in range(2)]


def _check_sizes(case: Case, meta: dict) -> None:
    sizes = meta["sizes"]
    assert (sizes["task_1_classes"], sizes["task_2_classes"]) == case.task_sizes
    assert (sizes["batch"], sizes["samples"], sizes["templates"]) == (
        case.batch,
        case.samples,
        case.templates,
    )


def test_the_vga_has_the_official_shape():
    """The official layer has 1 head and the default 2048-wide feed-forward: the suite's defaults."""
    _, meta = load_golden("clap.encoders")
    config = CLAP.Config()
    assert (config.vga_heads, config.vga_feedforward) == (
        meta["sizes"]["vga_heads"],
        meta["sizes"]["vga_feedforward"],
    )
    assert config.vga_dropout == 0.1 and "'dropout': [0.1, 0.1, 0.1, 0.1]" in meta["notes"]


def test_language_aware_init_mask_and_text_features_equal_the_official():
    tensors, meta = load_golden("clap.encoders")
    _check_sizes(ENCODERS, meta)
    strategy = suite_clap(ENCODERS, tensors["input.templates"])  # its own initialisation, nothing loaded
    for task, encoder in enumerate(strategy.encoders):
        close(f"W_mu {task}", encoder.mu.weight, tensors[f"output.init.mu_weight.{task}"], INIT_ATOL)
        close(f"W_sigma {task}", encoder.sigma.weight, tensors[f"output.init.sigma_weight.{task}"], INIT_ATOL)
    assert torch.equal(task_mask(list(ENCODERS.task_sizes), "cpu"), tensors["output.mask"].bool())
    close("t_c", strategy.class_text(list(range(ENCODERS.classes))), tensors["output.text"], ATOL)


def test_vga_and_encoders_equal_the_official_with_gradients():
    tensors, _ = load_golden("clap.encoders")
    strategy = _strategy(ENCODERS, tensors)
    strategy.vga.train()  # as in training; dropout is 0
    tasks, noise = _tasks(ENCODERS), _noise(tensors, "train")
    image = F.normalize(tensors["input.image"], dim=-1)
    text = strategy.class_text([c for task in tasks for c in task])
    vga = strategy.adapted_text(text, image, [len(t) for t in tasks], strategy.cfg.vga_context)[0] - text
    close("VGA output", vga, tensors["output.vga"], ATOL)
    functional = (tensors["input.cotangent.vga"] * vga).sum()
    for task in range(2):  # each class attends to its own task only: a prefix of the tasks gives task i's
        _, (mu, sigma, z) = strategy.sample_logits(
            image, tasks[: task + 1], noise[: task + 1], strategy.cfg.vga_context
        )
        mu, sigma, z = mu[0], sigma[0], z[:, 0]
        start = sum(len(t) for t in tasks[:task])
        encoder_input = (text + vga)[start : start + len(tasks[task])]
        close(f"encoder input {task}", encoder_input, tensors[f"output.encoder_input.{task}"], ATOL)
        for kind, ours in (("mu", mu), ("sigma", sigma), ("z", z)):
            close(f"{kind} {task}", ours, tensors[f"output.{kind}.{task}"], ATOL)
            functional = functional + (tensors[f"input.cotangent.{kind}.{task}"] * ours).sum()
    functional.backward()
    trained = {f"vga.{n}": p for n, p in strategy.vga.named_parameters()}
    trained |= {f"encoders.{n}": p for n, p in strategy.encoders.named_parameters() if p.requires_grad}
    assert set(trained) == {k.removeprefix("grad.") for k in tensors if k.startswith("grad.")}
    for name, parameter in trained.items():
        close(f"grad {name}", parameter.grad, tensors[f"grad.{name}"], GRAD_ATOL)


def test_logits_kl_lasp_and_loss_equal_the_official_with_gradients():
    tensors, meta = load_golden("clap.logits_kl")
    _check_sizes(LOGITS, meta)
    strategy = _strategy(LOGITS, tensors)
    assert strategy.backbone.logit_scale == pytest.approx(tensors["input.logit_scale"].item(), rel=1e-6)
    strategy.vga.train()
    tasks, image = _tasks(LOGITS), F.normalize(tensors["input.image"], dim=-1)
    logits, (mu, sigma, z) = strategy.sample_logits(
        image, tasks, _noise(tensors, "train"), strategy.cfg.train_vga_context
    )
    close("training logits", logits, tensors["output.logits"], LOGIT_ATOL)
    kl, lasp = kl_to_standard_normal(mu, sigma), lasp_loss(strategy.class_templates(tasks[1]), z)
    close("kl_weight * KL", strategy.cfg.kl_weight * kl, tensors["output.kl_term"], KL_ATOL)
    close("lasp_weight * LASP", strategy.cfg.lasp_weight * lasp, tensors["output.lasp_term"], LASP_ATOL)
    local_targets = tensors["input.labels"] - LOGITS.task_sizes[0]
    loss = strategy.compute_loss(CLAPOutput(logits.reshape(-1, logits.shape[-1]), kl, lasp), local_targets)
    close("loss", loss, tensors["output.loss"], LOSS_ATOL)
    loss.backward()
    trained = {f"vga.{n}": p for n, p in strategy.vga.named_parameters()}
    trained |= {f"encoders.{n}": p for n, p in strategy.encoders.named_parameters() if p.requires_grad}
    assert set(trained) == {k.removeprefix("grad.") for k in tensors if k.startswith("grad.")}
    for name, parameter in trained.items():
        close(f"grad {name}", parameter.grad, tensors[f"grad.{name}"], GRAD_ATOL)


def test_evaluation_logits_equal_the_official_with_the_batch_as_context():
    tensors, _ = load_golden("clap.logits_kl")
    strategy = _strategy(LOGITS, tensors)
    strategy.vga.eval()
    with torch.no_grad():
        image = F.normalize(tensors["input.image"], dim=-1)
        logits, _ = strategy.sample_logits(
            image, _tasks(LOGITS), _noise(tensors, "eval"), strategy.cfg.vga_context
        )
    close("evaluation logits", logits, tensors["output.eval_logits"], LOGIT_ATOL)


def test_lasp_and_its_weight_equal_the_official():
    tensors, meta = load_golden("clap.lasp_schedule")
    config = CLAP.Config()
    assert meta["sizes"]["lasp"] == 1 and meta["sizes"]["beta"] == config.lasp_weight  # on, at 15
    assert meta["sizes"]["templates"] == LASP.templates
    z = tensors["input.z"].clone().requires_grad_(True)
    term = config.lasp_weight * lasp_loss(tensors["input.templates"], z)
    close("15 * LASP", term, tensors["output.lasp_term"], LASP_ATOL)
    term.backward()
    close("d LASP / d z", z.grad, tensors["grad.z"], ATOL)


def _suite_lrs(sizes: dict) -> torch.Tensor:
    """The lr of each step of a task under CLAP's default config, as the strategy steps it."""
    config = CLAP.Config()
    assert (config.epochs, config.batch_size) == (sizes["epochs"], sizes["train_batch"])
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], config)
    scheduler = build_scheduler(optimizer, config, config.epochs, sizes["steps_per_epoch"])
    lrs = []
    for _ in range(config.epochs * sizes["steps_per_epoch"]):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return torch.tensor(lrs, dtype=torch.float64)


def test_lr_schedule_equals_the_official_at_every_step():
    """At a CIFAR-100 task (T = 785 steps): int(0.3 T) = 235 steps of warm-up at lr (k + 1) / 236, then
    the cosine from step 235 down to the floor (clap4clip classifier/utils.py cosine_schedule_warmup;
    strategies/optim.py, the warmup_fraction form)."""
    tensors, meta = load_golden("clap.lasp_schedule")
    official, ours = tensors["output.lr"].double(), _suite_lrs(meta["sizes"])
    torch.testing.assert_close(ours, official, rtol=LR_RTOL, atol=0)
