"""Loop goldens of the CODA-Prompt codebase (GT-RIPL/CODA-Prompt): the official training loop of
``learners/default.py`` (``NormalNN.learn_batch``: the optimiser reset per task, the per-epoch
``CosineSchedule``, ``update_model``) with ``learners/prompt.py``'s ``Prompt`` learners (their Adam
over ``prompt`` and ``last``, the CE over the current classes with the earlier ones at -inf, the
prompt loss added), run over two tasks beside the suite's ``L2PPlusPlus``, ``DualPrompt`` and
``CodaPrompt`` (``suite_loop.run_suite_loop``: their own ``learn``).

The official learner builds its model through ``models.<model_type>.<model_name>``; here that
factory (``TinyZoo``) is ``models/zoo.py``'s ``ViTZoo`` on the tiny CLIP: the official prompt module
(``zoo.L2P`` / ``zoo.DualPrompt`` / ``zoo.CodaPrompt``) called per block as ``VisionTransformer.forward``
calls it, its prefixes joined to the tiny CLIP's blocks, the query and the feature the frozen and
the prompted image embedding (D6), ``last`` a Linear on it. Both sides start from the suite's
tensors, see the same batches in the same order (3 epochs of 2 batches a task) and, at task 1,
CODA's new slice is drawn by the official ``process_task_count`` (its draws are stored for the
suite to replay). Recorded per step: the loss, the learning rate of every group, every trainable
tensor (suite names); per task: the logits of fixed test images over the seen classes.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import torch
from torch import nn

from tests.official.goldens import component
from tests.official.goldens.coda_prompt_method import keep_draws
from tests.official.goldens.coda_prompt_repo import (
    CODA,
    TIMM_STUBS,
    TorchCallRecorder,
    start_task,
    suite_strategy,
    timm_stubs,
)
from tests.official.goldens.golden import Golden, official_import_path, stub_module
from tests.official.goldens.loop import float64_golden
from tests.official.goldens.suite_loop import EpochBatches

TASKS = [[0, 1], [2, 3]]
EPOCHS, STEPS, BATCH, TEST, IMAGE = 3, 2, 4, 6, 32  # 6 steps a task; the schedule moves every 2
TRAIN = dict(epochs=EPOCHS, batch_size=BATCH, lr=1e-3)  # the official Adam's lr (configs/*_prompt.yaml)
LAYERS = 4
CONFIGS = {
    # L2P's top-k is 5 in the official code (models/zoo.py), so the pool holds at least 5
    "l2p_pp": dict(pool_size=8, prompt_length=4, top_k=5, prompt_layer=0, key_loss="all_pairs", **TRAIN),
    "dualprompt": dict(
        g_length=4, g_layers=[0, 1], e_length=4, e_layers=[2, 3], pool_size=3, **TRAIN
    ),  # the official E layers are 2-4; the tiny ViT has 4 blocks
    "coda_prompt": dict(components=4, prompt_length=4, prompt_layers=[0, 1, 2, 3], **TRAIN),
}
# (learner class in learners/prompt.py, prompt module in models/zoo.py, prompt_param[1] of run.py)
OFFICIAL = {
    "l2p_pp": ("L2P", "L2P", lambda c: [c["pool_size"], c["prompt_length"], -1]),
    "dualprompt": ("DualPrompt", "DualPrompt", lambda c: [c["pool_size"], c["e_length"], c["g_length"]]),
    "coda_prompt": ("CODAPrompt", "CodaPrompt", lambda c: [c["components"], c["prompt_length"], 0.0]),
}
SEEDS = {"l2p_pp": 61, "dualprompt": 62, "coda_prompt": 63}
LOADING = (
    "learners/default.py and learners/prompt.py as learners.default / learners.prompt under a stub "
    "package 'learners'; models/vit.py and models/zoo.py as models.vit / models.zoo under a stub package "
    "'models' that also holds a stub 'models.golden' whose tiny_clip(out_dim, prompt_flag, prompt_param) "
    f"builds TinyZoo (ViTZoo on the tiny CLIP, see the notes); {TIMM_STUBS}; utils/metric.py and "
    "utils/schedulers.py the real ones. The learner's cuda attribute is set to False on the instance: "
    "data_weighting tests `if self.cuda` (a bound method, always true) and would move its all-ones "
    "weights to a GPU. learn_batch is called as trainer.py calls it (model.task_id = t, "
    "add_valid_output_dim, process_task_count from task 1), printing silenced; update_model is "
    "wrapped on the instance to record the learning rates before and the loss and tensors after it."
)


def strategy_class(method: str):
    from strategies.methods.coda_prompt import CodaPrompt
    from strategies.methods.dualprompt import DualPrompt
    from strategies.methods.l2p_pp import L2PPlusPlus

    return {"l2p_pp": L2PPlusPlus, "dualprompt": DualPrompt, "coda_prompt": CodaPrompt}[method]


def suite_tensors(method: str, strategy) -> dict[str, torch.Tensor]:
    """The trainable tensors the loop compares, by suite name."""
    module = {"l2p_pp": "pool", "dualprompt": "prompts", "coda_prompt": "components"}[method]
    named = {f"head.{n}": p for n, p in strategy.head.named_parameters()}
    named.update({f"{module}.{n}": p for n, p in getattr(strategy, module).named_parameters()})
    return named


def official_tensors(method: str, model) -> dict[str, torch.Tensor]:
    """The official model's tensors under the suite's names and layouts."""
    p, cfg = model.prompt, CONFIGS[method]
    out = {"head.weight": model.last.weight, "head.bias": model.last.bias}
    if method == "l2p_pp":
        out.update({"pool.prompts": p.e_p_0, "pool.keys": p.e_k_0})
    elif method == "dualprompt":
        out["prompts.g"] = torch.stack([getattr(p, f"g_p_{layer}") for layer in cfg["g_layers"]])
        out["prompts.e"] = torch.stack([getattr(p, f"e_p_{layer}") for layer in cfg["e_layers"]], dim=1)
        out["prompts.keys"] = torch.stack([getattr(p, f"e_k_{layer}") for layer in cfg["e_layers"]])
    else:
        for name, short in (("prompts", "e_p"), ("keys", "e_k"), ("attention", "e_a")):
            out[f"components.{name}"] = torch.stack(
                [getattr(p, f"{short}_{layer}") for layer in range(LAYERS)]
            )
    return {n: t.detach().clone() for n, t in out.items()}


def _load_official(method: str, model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy the suite's tensors into the official model (as fresh parameters where the official code
    replaces them itself, CODA's ``gram_schmidt``)."""
    p, cfg = model.prompt, CONFIGS[method]
    with torch.no_grad():
        model.last.weight.copy_(tensors["head.weight"])
        model.last.bias.copy_(tensors["head.bias"])
        if method == "l2p_pp":
            p.e_p_0.copy_(tensors["pool.prompts"])
            p.e_k_0.copy_(tensors["pool.keys"])
        elif method == "dualprompt":
            for i, layer in enumerate(cfg["g_layers"]):
                getattr(p, f"g_p_{layer}").copy_(tensors["prompts.g"][i])
            for i, layer in enumerate(cfg["e_layers"]):
                getattr(p, f"e_p_{layer}").copy_(tensors["prompts.e"][:, i])
                getattr(p, f"e_k_{layer}").copy_(tensors["prompts.keys"][i])
        else:
            for name, short in (("prompts", "e_p"), ("keys", "e_k"), ("attention", "e_a")):
                for layer in range(LAYERS):
                    setattr(p, f"{short}_{layer}", nn.Parameter(tensors[f"components.{name}"][layer].clone()))


class TinyZoo(nn.Module):
    """``ViTZoo`` on the tiny CLIP: ``feat`` the frozen tiny CLIP, ``prompt`` the official module,
    ``last`` a Linear on the prompted embedding; ``forward`` as ``ViTZoo.forward`` with
    ``VisionTransformer.forward``'s per-block prompt calls and summed loss."""

    def __init__(self, backbone, prompt: nn.Module, out_dim: int) -> None:
        super().__init__()
        self.feat, self.prompt = backbone, prompt
        self.last = nn.Linear(backbone.embed_dim, out_dim)
        self.task_id = None

    def forward(self, x, pen=False, train=False):
        with torch.no_grad():
            q = self.feat.encode_image(x, normalize=False)
        # VisionTransformer.forward's zeros((1,), requires_grad=True).cuda(): a copy, not a leaf
        prompt_loss = torch.zeros((1,), requires_grad=True).clone()
        prefixes = {}
        for i in range(LAYERS):
            p_list, loss, _ = self.prompt.forward(q, i, None, train=train, task_id=self.task_id)
            if train:
                prompt_loss += loss
            if p_list is not None:
                prefixes[i] = (p_list[0], p_list[1])
        with self.feat.visual_prefix(prefixes):
            out = self.feat.encode_image(x, normalize=False)
        out = self.last(out)
        return (out, prompt_loss) if train else out


def draw_batches(seed: int) -> dict[str, torch.Tensor]:
    """Seeded images and labels of every (task, epoch, step), and the test images."""
    generator = torch.Generator().manual_seed(seed)
    out = {"input.test.images": torch.randn(TEST, 3, IMAGE, IMAGE, generator=generator)}
    for t, classes in enumerate(TASKS):
        for e in range(EPOCHS):
            for s in range(STEPS):
                key = f"input.task{t}.epoch{e}.step{s}"
                out[f"{key}.images"] = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
                pick = torch.randint(len(classes), (BATCH,), generator=generator)
                out[f"{key}.labels"] = torch.tensor(classes)[pick]
    return out


def batches_of(tensors: dict[str, torch.Tensor], task: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    key = "input.task{t}.epoch{e}.step{s}"
    return [
        [
            (
                tensors[key.format(t=task, e=e, s=s) + ".images"],
                tensors[key.format(t=task, e=e, s=s) + ".labels"],
            )
            for s in range(STEPS)
        ]
        for e in range(EPOCHS)
    ]


def suite_start(method: str, seed: int):
    """The suite's strategy as both sides start from it (CODA: its task-0 slice drawn)."""
    strategy = suite_strategy(strategy_class(method), 4, seed, **CONFIGS[method])
    if method == "coda_prompt":
        start_task(strategy, 0, TASKS[0])
    return strategy


def _learner_config(method: str, config: dict) -> dict:
    # trainer.py's learner_config with configs/cifar-100_prompt.yaml's optimiser and schedule
    return {
        "num_classes": 4,
        "lr": config["lr"],
        "debug_mode": False,
        "momentum": 0.9,
        "weight_decay": 0.0,
        "schedule": [config["epochs"]],
        "schedule_type": "cosine",
        "model_type": "golden",
        "model_name": "tiny_clip",
        "optimizer": "Adam",
        "gpuid": [-1],
        "memory": 0,
        "temp": 2.0,
        "out_dim": 4,
        "overwrite": True,
        "DW": False,
        "batch_size": config["batch_size"],
        "upper_bound_flag": False,
        "tasks": TASKS,
        "top_k": 1,
        "prompt_param": [len(TASKS), OFFICIAL[method][2](config)],
    }


def prompt_loop(method: str, checkout: Path) -> Golden:
    # both sides in float64 (the tiny CLIP built in it); the float32 draws read in float64
    return float64_golden(
        draw_batches(SEEDS[method]), lambda batches: _prompt_loop(method, checkout, batches)
    )


def _prompt_loop(method: str, checkout: Path, batches: dict[str, torch.Tensor]) -> Golden:
    seed = SEEDS[method]
    strategy = suite_start(method, seed)
    strategy.backbone.to(torch.float64)  # open_clip builds it in float32 whatever the default
    start = {f"param.{n}": t.detach().clone() for n, t in suite_tensors(method, strategy).items()}
    tensors = {**batches, **start}
    learner_name, prompt_name, prompt_param = OFFICIAL[method]
    with_zoo: dict = {}

    def tiny_clip(out_dim, prompt_flag=None, prompt_param=None):
        zoo = with_zoo["zoo"]
        prompt = getattr(zoo, prompt_name)(
            strategy.visual_width, prompt_param[0], prompt_param[1], key_dim=strategy.backbone.embed_dim
        )
        return TinyZoo(copy.deepcopy(strategy.backbone), prompt, out_dim)

    stubs = timm_stubs()
    stubs["models"] = stub_module("models", __path__=[str(checkout / "models")])
    stubs["models.golden"] = stub_module("models.golden", tiny_clip=tiny_clip)
    stubs["models"].golden = stubs["models.golden"]
    stubs["learners"] = stub_module("learners", __path__=[str(checkout / "learners")])
    with official_import_path(checkout, stubs) as load, contextlib.redirect_stdout(io.StringIO()):
        load("models/vit.py", "models.vit")
        with_zoo["zoo"] = stubs["models"].zoo = load("models/zoo.py", "models.zoo")
        load("learners/default.py", "learners.default")
        learners = load("learners/prompt.py", "learners.prompt")
        learner = getattr(learners, learner_name)(_learner_config(method, CONFIGS[method]))
        learner.cuda = False  # see LOADING
        model = learner.model
        model.to(torch.float64)  # zoo.tensor_prompt makes its parameters as FloatTensor, float32
        _load_official(method, model, {n[len("param.") :]: t for n, t in start.items()})
        step = [0]
        update_model = learner.update_model

        def recorded(inputs, targets):
            lrs = [group["lr"] for group in learner.optimizer.param_groups]
            loss, logits = update_model(inputs, targets)
            key = f"output.step{step[0]}"
            tensors[f"{key}.loss"] = loss.detach().reshape(())
            tensors[f"{key}.lr"] = torch.tensor(lrs, dtype=torch.float64)
            for name, t in official_tensors(method, model).items():
                tensors[f"{key}.{name}"] = t
            step[0] += 1
            return loss, logits

        learner.update_model = recorded
        for task, classes in enumerate(TASKS):
            model.task_id = task
            learner.add_valid_output_dim(len(classes))
            if task:
                recorder = TorchCallRecorder()
                with recorder:
                    model.prompt.process_task_count()
                if method == "coda_prompt":
                    per_task = CONFIGS[method]["components"] // len(TASKS)
                    keep_draws(tensors, f"state.task{task}.draws", recorder.draws, per_task)
            learner.learn_batch(EpochBatches(batches_of(tensors, task)), None, None)
            model.eval()
            with torch.no_grad():
                scores = model(tensors["input.test.images"])[:, : learner.valid_out_dim]
            tensors[f"output.task{task}.scores"] = scores
    assert step[0] == len(TASKS) * EPOCHS * STEPS, step[0]
    return Golden(
        component=f"{method}.loop",
        official=CODA,
        file="learners/default.py, learners/prompt.py",
        function=f"NormalNN.learn_batch with prompt.{learner_name} (update_model, init_optimizer)",
        loading=LOADING,
        seed=seed,
        sizes={"tasks": len(TASKS), "epochs": EPOCHS, "steps_per_epoch": STEPS, "batch": BATCH, "test": TEST},
        tensors=tensors,
        notes=(
            f"Suite: {strategy_class(method).__name__} on the tiny CLIP, options {CONFIGS[method]}, classes "
            f"{TASKS}; param.* = its tensors at the start (CODA: after setup_task(0)), copied into the "
            f"official {prompt_name}(128, {len(TASKS)}, {prompt_param(CONFIGS[method])}, key_dim=256) and "
            "last. Official: learner_config of trainer.py with configs/cifar-100_prompt.yaml's Adam (lr, "
            "momentum 0.9 as beta1, wd 0) and cosine schedule of `schedule[-1]` epochs; learn_batch per task "
            "on a loader whose pass e yields input.task{t}.epoch{e}.step{s}.* (drop_last batches of 4, no "
            "task label used). output.step{n}.*: after the n-th update_model over the stream, the loss, the "
            "lr of every group as used by that step, every trainable tensor (suite names and layouts). "
            "output.task{t}.scores: model(test images)[:, :valid_out_dim] after task t (eval). CODA: "
            "state.task1.draws.* the official process_task_count's torch.randn_like draws (layers 0-3 of "
            "0-4, K, A, P), for the suite to replay. Both sides in float64 (torch's default dtype while "
            "they run: the tiny CLIP, the prompts and head are built in it); param.*, state.* and "
            "outputs stored in float64."
        ),
        float64=("output.", "param.", "state."),
    )


@component("l2p_pp.loop", CODA)
def l2p_loop(checkout: Path) -> Golden:
    return prompt_loop("l2p_pp", checkout)


@component("dualprompt.loop", CODA)
def dualprompt_loop(checkout: Path) -> Golden:
    return prompt_loop("dualprompt", checkout)


@component("coda_prompt.loop", CODA)
def coda_loop(checkout: Path) -> Golden:
    return prompt_loop("coda_prompt", checkout)
