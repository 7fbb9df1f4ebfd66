"""Golden outputs of CODA-Prompt's own module in its codebase (GT-RIPL/CODA-Prompt): ``CodaPrompt``
of ``models/zoo.py`` (``coda_prompt.attention``: the components weighted by their attention to the
query; ``coda_prompt.tasks``: the components of each task, grown and orthogonalised by Gram-Schmidt
over three tasks), against the suite's ``strategies/methods/coda_prompt.py``. Loaded and probed as
``coda_prompt_repo`` says.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens.coda_prompt_repo import (
    BATCH,
    CODA,
    LAYERS,
    LOADING,
    TorchCallRecorder,
    finish_task,
    grad_or_zeros,
    official_modules,
    prefix_readout,
    probe_tensor,
    start_task,
    suite_strategy,
)
from tests.official.goldens.golden import Golden, looks_trained

CODA_CONFIG = dict(components=6, prompt_length=4, prompt_layers=[0, 1, 2, 3])
CODA_CLASSES = 6  # 3 tasks of 2 classes: 2 components per task
CODA_TASKS = [[0, 1], [2, 3], [4, 5]]
_SUITE_TO_OFFICIAL = {"prompts": "e_p", "keys": "e_k", "attention": "e_a"}


def _coda_sizes(tasks: dict[str, int], width: int, key_dim: int) -> dict[str, int]:
    """The sizes of a CodaPrompt golden: 6 components of length 4 in the tiny CLIP's blocks, ``tasks``."""
    return {
        "batch": BATCH,
        "components": 6,
        **tasks,
        "length": 4,
        "layers": LAYERS,
        "width": width,
        "key_dim": key_dim,
    }


def _coda_golden(component: str, function: str, seed: int, sizes: dict, tensors: dict, notes: str) -> Golden:
    """A golden of the official ``CodaPrompt`` (``models/zoo.py``), loaded as ``coda_prompt_repo`` does."""
    return Golden(component, CODA, "models/zoo.py", function, LOADING, seed, sizes, tensors, notes)


def _official_coda(zoo, width: int, key_dim: int):
    # prompt_param = (components, length, ortho weight) (experiments/cifar-100.sh: 100 8 0.0)
    return zoo.CodaPrompt(
        width, len(CODA_TASKS), [CODA_CONFIG["components"], CODA_CONFIG["prompt_length"], 0.0], key_dim
    )


def _set_coda(official, parameters: dict[str, torch.Tensor]) -> None:
    """Official ``e_{p,k,a}_l`` = the suite's ``[layer i]`` tensors, as fresh parameters (as the
    official ``gram_schmidt`` leaves them)."""
    for name, tensor in parameters.items():
        for i, layer in enumerate(CODA_CONFIG["prompt_layers"]):
            setattr(official, f"{_SUITE_TO_OFFICIAL[name]}_{layer}", nn.Parameter(tensor[i].detach().clone()))


def _get_coda(official, what=lambda p: p.detach().clone()) -> dict[str, torch.Tensor]:
    return {
        name: torch.stack(
            [what(getattr(official, f"{short}_{layer}")) for layer in CODA_CONFIG["prompt_layers"]]
        )
        for name, short in _SUITE_TO_OFFICIAL.items()
    }


def _run_coda(official, inputs: dict, train: bool, tag: str) -> dict[str, torch.Tensor]:
    """The official forward over blocks 0..3; outputs (alpha, prefixes, loss) under ``tag`` and, in
    training, the backward of loss + the probes' read-out."""
    recorder = TorchCallRecorder()
    loss, readout, out = torch.zeros(()), torch.zeros(()), {}
    keys, values = [], []
    with recorder:
        for layer in range(LAYERS):
            p_list, layer_loss, _ = official.forward(inputs["input.query"], layer, None, train=train)
            loss = loss + layer_loss
            keys.append(p_list[0])
            values.append(p_list[1])
            readout = readout + prefix_readout(
                p_list, inputs["input.probe_keys"][layer], inputs["input.probe_values"][layer]
            )
    alphas = [operands[0] for equation, operands in recorder.einsum if equation == "bk,kld->bld"]
    out[f"output.{tag}.alpha"] = torch.stack(alphas)  # [layers, B, components in use]
    out[f"output.{tag}.prefix_keys"] = torch.stack(keys).detach()
    out[f"output.{tag}.prefix_values"] = torch.stack(values).detach()
    out[f"output.{tag}.loss"] = torch.as_tensor(loss).detach()
    if train:
        (loss + readout).backward()
    return out


def _coda_inputs(generator: torch.Generator, key_dim: int, width: int) -> dict[str, torch.Tensor]:
    half = CODA_CONFIG["prompt_length"] // 2
    return {
        "input.query": torch.randn(BATCH, key_dim, generator=generator),
        "input.probe_keys": probe_tensor(generator, LAYERS, BATCH, half, width),
        "input.probe_values": probe_tensor(generator, LAYERS, BATCH, half, width),
    }


@component("coda_prompt.attention", CODA)
def coda_attention(checkout: Path) -> Golden:
    from strategies.methods.coda_prompt import CodaPrompt

    seed = 41
    strategy = suite_strategy(CodaPrompt, CODA_CLASSES, seed, **CODA_CONFIG)
    start_task(strategy, 0, CODA_TASKS[0])
    finish_task(strategy, 0, CODA_TASKS[0])
    start_task(strategy, 1, CODA_TASKS[1])  # task 1: components [0, 2) used detached, [2, 4) learn
    generator = torch.Generator().manual_seed(seed)
    looks_trained(strategy.components, generator)  # away from the orthonormal initialisation
    width, key_dim = strategy.visual_width, strategy.components.keys.shape[-1]
    inputs = _coda_inputs(generator, key_dim, width)
    params = {f"param.components.{n}": t.detach().clone() for n, t in strategy.components.named_parameters()}
    with official_modules(checkout) as load:
        load("models/vit.py", "models.vit")
        zoo = load("models/zoo.py", "models.zoo")
        official = _official_coda(zoo, width, key_dim)
        official.process_task_count()  # task 1 (its Gram-Schmidt draws are overwritten next)
        _set_coda(official, {n: params[f"param.components.{n}"] for n in _SUITE_TO_OFFICIAL})
        out = _run_coda(official, inputs, train=True, tag="train")
        grads = {f"grad.components.{n}": g for n, g in _get_coda(official, grad_or_zeros).items()}
        out.update(_run_coda(official, inputs, train=False, tag="eval"))
    return _coda_golden(
        "coda_prompt.attention",
        "CodaPrompt.forward (task_count=1, ortho_mu=0.0)",
        seed,
        _coda_sizes({"per_task": 2, "task": 1}, width, key_dim),
        {**inputs, **params, **out, **grads},
        (
            f"Suite: CodaPrompt on the tiny CLIP, options {CODA_CONFIG}, {CODA_CLASSES} classes in tasks "
            f"{CODA_TASKS}; tasks 0 and 1 set up (Gram-Schmidt), then looks_trained(seed) on every "
            "component tensor. Official: CodaPrompt(emb_d=128, n_tasks=3, prompt_param=[6, 4, 0.0], "
            "key_dim=256) after one process_task_count (task_count=1), e_{p,k,a}_l = the suite's layer l, "
            "forward(query, l, None, train) for l = 0..3 (its layer 4 is past the tiny ViT). alpha = the "
            "first operand of the official einsum 'bk,kld->bld', [layers, B, components in use]. Train "
            "uses [0, 4) ([0, 2) detached), eval [0, 4). Loss: the ortho penalty at weight 0.0 (the "
            "official runs'), i.e. 0. Gradients of loss + the probes' read-out (train)."
        ),
    )


UPDATE = 0.05  # the size of the seeded change of a task's slice ("training"), as looks_trained's


@component("coda_prompt.tasks", CODA)
def coda_tasks(checkout: Path) -> Golden:
    from strategies.methods.coda_prompt import CodaPrompt

    seed = 51
    strategy = suite_strategy(CodaPrompt, CODA_CLASSES, seed, **CODA_CONFIG)
    start_task(strategy, 0, CODA_TASKS[0])  # the suite's own initialisation of task 0's slice
    width, key_dim = strategy.visual_width, strategy.components.keys.shape[-1]
    per_task = CODA_CONFIG["components"] // len(CODA_TASKS)
    generator = torch.Generator().manual_seed(seed)
    inputs = _coda_inputs(generator, key_dim, width)
    tensors = {f"param.task0.{n}": t.detach().clone() for n, t in strategy.components.named_parameters()}
    state = {n: tensors[f"param.task0.{n}"] for n in _SUITE_TO_OFFICIAL}
    tensors_before_update: dict[str, torch.Tensor] = {}  # task 0's tensors before its update
    with official_modules(checkout) as load:
        load("models/vit.py", "models.vit")
        zoo = load("models/zoo.py", "models.zoo")
        official = _official_coda(zoo, width, key_dim)
        for task in range(len(CODA_TASKS)):
            start, stop = task * per_task, (task + 1) * per_task
            if task:
                # The official initialisation of the new slice, on the official state.
                recorder = TorchCallRecorder()
                with recorder:
                    official.process_task_count()
                keep_draws(tensors, f"state.task{task}.draws", recorder.draws, per_task)
                tensors.update({f"state.task{task}.{n}": t for n, t in _get_coda(official).items()})
                if task == 1:
                    # The same on task 0's untrained (orthonormal) rows: where the official
                    # Gram-Schmidt is exact, for the test to compare with the same draws.
                    recorder = TorchCallRecorder()
                    with recorder:
                        for name, tensor in tensors_before_update.items():
                            out = torch.stack(
                                [official.gram_schmidt(tensor[i].clone()) for i in range(LAYERS)]
                            )
                            tensors[f"state.task1.from_orthonormal.{name}"] = out.detach()
                    keep_draws(
                        tensors,
                        "state.task1.from_orthonormal.draws",
                        recorder.draws,
                        per_task,
                        layers_first=True,
                    )
            else:
                _set_coda(official, state)
            official.zero_grad(set_to_none=True)
            tensors.update(_run_coda(official, inputs, train=True, tag=f"task{task}"))
            tensors.update({f"grad.task{task}.{n}": g for n, g in _get_coda(official, grad_or_zeros).items()})
            if task + 1 < len(CODA_TASKS):
                # "Training": a seeded change of the task's own slice, which leaves it non-orthonormal.
                current = _get_coda(official)
                if task == 0:
                    tensors_before_update = dict(current)
                for name, tensor in current.items():
                    update = torch.zeros_like(tensor)
                    update[:, start:stop] = UPDATE * torch.randn(
                        update[:, start:stop].shape, generator=generator
                    )
                    tensors[f"input.task{task}.update.{name}"] = update
                    current[name] = tensor + update
                _set_coda(official, current)
        tensors.update(_run_coda(official, inputs, train=False, tag="eval"))
    return _coda_golden(
        "coda_prompt.tasks",
        "CodaPrompt.process_task_count / gram_schmidt / forward over three tasks",
        seed,
        _coda_sizes({"per_task": per_task, "tasks": len(CODA_TASKS)}, width, key_dim),
        {**inputs, **tensors},
        (
            f"Suite: CodaPrompt on the tiny CLIP, options {CODA_CONFIG}, tasks {CODA_TASKS}; param.task0.* "
            "= its tensors after setup_task(0) (its own initialisation), copied into the official "
            "CodaPrompt(128, 3, [6, 4, 0.0], 256). Per task t: the official train forward (blocks 0..3) "
            "and the gradients (grad.task{t}.*), then (t < 2) input.task{t}.update.* ("
            f"{UPDATE} N(0, 1) on the "
            "task's slice, zero elsewhere) added to the official tensors, then process_task_count: the "
            "official Gram-Schmidt on the official state (state.task{t}.*; its torch.randn_like draws in "
            "state.task{t}.draws.*, [layers, per_task, row size], layers 0..3 of the official 0..4). "
            "state.task1.from_orthonormal.*: the official gram_schmidt (task_count=1) applied to task 0's "
            "tensors before the update (orthonormal rows), with its draws. output.eval.*: the test-time "
            "forward after task 2 (components [0, 6))."
        ),
    )


def keep_draws(tensors, prefix, draws, per_task, layers_first=False) -> None:
    """The official Gram-Schmidt's draws ``[layers, per_task, n]`` per suite tensor name, for the
    suite's layers. ``process_task_count`` draws per layer (0..4) K, A, P, row after row;
    ``layers_first`` (the direct calls above): per tensor (prompts, keys, attention), layer after layer."""
    official_layers = 5
    names = ["keys", "attention", "prompts"]  # process_task_count: K, A, P
    if layers_first:
        names = list(_SUITE_TO_OFFICIAL)
        assert len(draws) == len(names) * LAYERS * per_task, len(draws)
        order = [(name, layer) for name in names for layer in range(LAYERS)]
    else:
        assert len(draws) == official_layers * len(names) * per_task, len(draws)  # no restarts happened
        order = [(name, layer) for layer in range(official_layers) for name in names]
    grouped: dict[str, list] = {name: [None] * LAYERS for name in names}
    for k, (name, layer) in enumerate(order):
        if layer < LAYERS:
            grouped[name][layer] = torch.stack(draws[k * per_task : (k + 1) * per_task])
    for name in names:
        tensors[f"{prefix}.{name}"] = torch.stack(grouped[name])
