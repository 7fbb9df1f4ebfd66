"""MG-CLIP, "Mind the Gap" (linlany/MindtheGap): its LoRA on k and v of both towers, the fusion of
the text and visual branches at inference, and the epoch probe, each run from the official files.

* ``mg_clip.lora``: ``loraclip/loralib/layers.py`` ``MultiheadAttention(only_kv=True)`` (the
  attention of every block of both towers under ``lora_mode = "vision+only_kv+text"``) with the
  suite's weights, and ``loraclip/model.py`` ``build_LoRA_model`` for which tensors train.
* ``mg_clip.fusion``: ``main.py`` ``run_class_incremental`` (two tasks, the visual agent on), with
  the real ``continual_clip/models.py`` (``ClassIncrementalCLIP``, ``forward_clip``,
  ``VisionClassifier``) around a stub CLIP whose towers return seeded features.
* ``mg_clip.epoch_probe``: ``epoch.py`` ``run_class_incremental`` (the probe: the gap before
  training, one measurement after each epoch, stop at the first relative move of more than 0.1)
  on seeded per-epoch image features, in five scenarios.

The official runners run offline as ``mindthegap_runner`` says. The suite's counterparts:
``benchmarks/backbone/lora.py`` (peft on ``SplitAttention``), ``strategies/methods/mg_clip.py``
(``fused_scores``, ``mean_non_target_logit``, ``gap_epoch_budget``, ``finish_task``),
``strategies/optim.py`` (``warmup_cosine_factor``).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import TensorDataset

from tests.official.goldens import component
from tests.official.goldens.golden import (
    Golden,
    Official,
    looks_trained,
    official_import_path,
    stub_module,
)
from tests.official.goldens.mindthegap_runner import (
    TEMPLATE,
    StubCLIP,
    Tasks,
    run_stubs,
    runner_config,
    suite_logit_scale,
)

MINDTHEGAP = Official("linlany/MindtheGap", "f40bfceae67395c54c75f5504841200cd217d4a0", "MindtheGap")
SEED = 0
TOWERS = {"visual": "mg_visual", "text": "mg_text"}


# ============================================================================ mg_clip.lora
def _official_attention(layers, attn, adapter: str, heads: int, width: int, rank: int) -> nn.Module:
    """The official only-k/v LoRA attention with the suite's SplitAttention + peft weights."""
    official = layers.MultiheadAttention(width, heads, r=rank, only_kv=True)
    k, v = attn.k_proj, attn.v_proj
    with torch.no_grad():
        official.q_proj_weight.copy_(attn.q_proj.weight)
        official.k_proj_weight.copy_(k.base_layer.weight)
        official.v_proj_weight.copy_(v.base_layer.weight)
        official.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, k.base_layer.bias, v.base_layer.bias]))
        official.out_proj.weight.copy_(attn.out_proj.weight)
        official.out_proj.bias.copy_(attn.out_proj.bias)
        official.k_proj_weight_lora_A.copy_(k.lora_A[adapter].weight)
        official.k_proj_weight_lora_B.copy_(k.lora_B[adapter].weight)
        official.v_proj_weight_lora_A.copy_(v.lora_A[adapter].weight)
        official.v_proj_weight_lora_B.copy_(v.lora_B[adapter].weight)
    return official


@component("mg_clip.lora", MINDTHEGAP)
def lora(checkout: Path) -> Golden:
    import open_clip

    from benchmarks.backbone import TINY_MODEL, BackboneSpec, create_clip
    from strategies.methods.mg_clip import MGCLIPConfig

    cfg = MGCLIPConfig()
    torch.manual_seed(SEED)
    backbone = create_clip(BackboneSpec(TINY_MODEL, "synthetic"))
    for tower, name in TOWERS.items():
        backbone.add_lora(name, tower, rank=cfg.lora_rank, alpha=cfg.lora_alpha, init_a="xavier")
    generator = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    sizes: dict[str, int] = {"rank": cfg.lora_rank}
    towers = {"visual": backbone.model.visual.transformer, "text": backbone.model.transformer}
    stubs = {"loraclip": stub_module("loraclip", __path__=[str(checkout / "loraclip")])}
    with official_import_path(checkout, stubs) as load:
        layers = load("loraclip/loralib/layers.py", "loraclip.loralib.layers")
        for tower, name in TOWERS.items():
            attn = towers[tower].resblocks[0].attn
            for proj in (attn.k_proj, attn.v_proj):
                looks_trained(proj.lora_B[name], generator)  # B = 0 at init: give it a trained size
            width, heads = attn.q_proj.weight.shape[0], attn.num_heads
            official = _official_attention(layers, attn, name, heads, width, cfg.lora_rank)
            length = 8 if tower == "text" else 17  # text: a context of 8; visual: 16 patches + class
            x = torch.randn(length, 3, width, generator=generator)  # [L, N, E], as the official blocks
            mask = (
                torch.empty(length, length).fill_(float("-inf")).triu_(1)  # build_attention_mask
                if tower == "text"
                else None
            )
            weight = torch.randn(length, 3, width, generator=generator)
            out = official(x, x, x, need_weights=False, attn_mask=mask)[0]
            loss = (out * weight).sum()
            loss.backward()
            for key, param in official.named_parameters():
                tensors[f"param.{tower}.{key}"] = param.detach()
                if "lora" in key:  # what trains officially (mark_only_lora_as_trainable)
                    tensors[f"grad.{tower}.{key}"] = param.grad
            tensors[f"input.{tower}.x"] = x
            tensors[f"input.{tower}.loss_weight"] = weight
            if mask is not None:
                tensors[f"input.{tower}.attn_mask"] = mask
            tensors[f"output.{tower}.attention"] = out
            tensors[f"output.{tower}.loss"] = loss.detach()
            tensors[f"output.{tower}.scaling"] = torch.tensor(official.scaling, dtype=torch.float64)
            sizes[f"{tower}_width"], sizes[f"{tower}_heads"] = width, heads

        # Which tensors train in the whole model: build_LoRA_model on the suite's (unsplit) CLIP state.
        model = load("loraclip/model.py", "loraclip.model")
        state = open_clip.create_model(TINY_MODEL, pretrained=None).state_dict()
        lora_clip = model.build_LoRA_model(state, cfg.lora_rank, "vision+only_kv+text")
        for key, param in lora_clip.named_parameters():
            if param.requires_grad:
                tensors[f"output.trainable.{key}"] = torch.tensor(param.shape)
    return Golden(
        component="mg_clip.lora",
        official=MINDTHEGAP,
        file="loraclip/loralib/layers.py",
        function="MultiheadAttention(only_kv=True).forward (multi_head_attention_forward); "
        "loraclip/model.py build_LoRA_model",
        loading=(
            "the package loraclip is a stub with the checkout's loraclip/ as its path, so that "
            "loraclip/__init__.py (which imports lora_clip.py: clip, pkg_resources, downloads) is never "
            "run; loralib/layers.py, loralib/utils.py and model.py are imported as is"
        ),
        seed=SEED,
        sizes=sizes,
        tensors=tensors,
        notes=(
            "Block 0's attention of each tower of the suite's tiny CLIP (synthetic weights), its "
            "peft LoRA added as MG-CLIP adds it (rank 8, alpha 1, A xavier_uniform_), B given a "
            "seeded 0.05 randn (looks_trained); the weights copied into the official module built "
            "with the suite's head count. Input [L, N, E] seeded; the text tower with the official "
            "causal mask; loss = sum(out * loss_weight), gradients of the LoRA A/B of k and v. "
            "output.trainable.<name>: the shape of each tensor build_LoRA_model leaves trainable."
        ),
    )


# ============================================================================ mg_clip.fusion
FUSION_ORDER = [4, 1, 5, 0, 3, 2]  # class ids in task order (2 tasks of 3)
FUSION_TRAIN_PER_CLASS, FUSION_TEST_PER_CLASS, FUSION_DIM = 4, 2, 32


class _Recorded(torch.Tensor):
    """A tensor that logs the results of the operations on it (the official fusion's arithmetic)."""

    results: list[tuple[str, torch.Tensor]] = []

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        out = super().__torch_function__(func, types_, args, kwargs or {})
        if isinstance(out, torch.Tensor):
            cls.results.append((getattr(func, "__name__", ""), out.as_subclass(torch.Tensor).clone()))
        return out


@component("mg_clip.fusion", MINDTHEGAP)
def fusion(checkout: Path) -> Golden:
    from strategies.methods.mg_clip import MGCLIPConfig

    cfg_suite = MGCLIPConfig()
    generator = torch.Generator().manual_seed(SEED)
    n_classes, per_task = len(FUSION_ORDER), len(FUSION_ORDER) // 2
    class_names = [f"class{i}" for i in range(n_classes)]
    texts = torch.randn(n_classes, FUSION_DIM, generator=generator)  # by class id
    logit_scale = suite_logit_scale()
    # Samples: position p in the class order is the label (continuum relabels by the order).
    train, test, ids, labels_of = Tasks(), Tasks(), 0, {}
    for task in range(2):
        for split, per_class in ((train, FUSION_TRAIN_PER_CLASS), (test, FUSION_TEST_PER_CLASS)):
            labels = torch.arange(task * per_task, (task + 1) * per_task).repeat_interleave(per_class)
            sample_ids = torch.arange(ids, ids + len(labels))
            ids += len(labels)
            split.append(TensorDataset(sample_ids, labels, torch.full_like(labels, task)))
            labels_of.update(zip(sample_ids.tolist(), labels.tolist()))
    labels = torch.tensor([labels_of[i] for i in range(ids)])
    class_of_sample = torch.tensor(FUSION_ORDER)[labels]
    # Image features near their class's text feature, with noise (unnormalised, as encode_image's).
    images = 2.0 * F.normalize(texts[class_of_sample], dim=-1) + torch.randn(
        ids, FUSION_DIM, generator=generator
    )
    prompts = {TEMPLATE.format(name): i for i, name in enumerate(class_names)}
    stub = StubCLIP(images[None], texts, logit_scale)
    classifier_calls: list[tuple[str, torch.Tensor]] = []
    eval_calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    softmax_calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def softmax(x, dim=None, **kwargs):
        out = torch.softmax(x, dim=dim)
        softmax_calls.append((x.detach().clone(), out.detach().clone()))
        return out.as_subclass(_Recorded)

    functional = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("__")})
    functional.softmax = softmax
    _Recorded.results = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        cfg = runner_config(
            Path(tmp),
            FUSION_ORDER,
            dataset="cifar100",
            batch_size=128,
            train_batch_size=128,
            increment=per_task,
            initial_increment=per_task,
            task_num=2,
            seed=42,
            epochs=0,  # the LoRA stage is not this component (its optimiser is skipped at 0)
            lr=cfg_suite.lr,
            visual_agent=True,
            visual_agent_lr=cfg_suite.visual_lr,
            visual_agent_batch_size=cfg_suite.visual_batch_size,
            visual_agent_epochs=cfg_suite.visual_epochs,
        )
        with official_import_path(
            checkout, run_stubs(checkout, stub, prompts, train, test, class_names)
        ) as load:
            models = load("continual_clip/models.py", "continual_clip.models")

            class Recording(models.VisionClassifier):
                def set_weight(self, weight):
                    classifier_calls.append(("set", weight.detach().clone()))
                    super().set_weight(weight)

                def add_weight(self, weight):
                    classifier_calls.append(("add", weight.detach().clone()))
                    super().add_weight(weight)

                def forward(self, x):
                    out = super().forward(x)
                    if not torch.is_grad_enabled():  # the evaluation's calls (main.py: under no_grad)
                        eval_calls.append(
                            (self.fc.detach().clone(), x.detach().clone(), out.detach().clone())
                        )
                    return out

            main = load("main.py", "mindthegap_main")
            main.VisionClassifier = Recording
            main.F = functional
            main.run_class_incremental(cfg, torch.device("cpu"))
    fused = [out for name, out in _Recorded.results if name == "div"]
    tensors: dict[str, torch.Tensor] = {
        "param.logit_scale": logit_scale,
        "input.text_features": texts,
        "input.image_features": images,
        "input.labels": labels,
        "input.class_order": torch.tensor(FUSION_ORDER),
    }
    for stage in range(2):
        weight, feature, vision_logits = eval_calls[stage]
        p_text, double = softmax_calls[2 * stage]
        # main.py's evaluation loader is not shuffled: the test tasks so far, in order
        tensors[f"input.stage{stage + 1}.test_ids"] = torch.cat(
            [test[t].tensors[0] for t in range(stage + 1)]
        )
        tensors[f"state.stage{stage + 1}.classifier"] = weight
        tensors[f"output.stage{stage + 1}.image_features"] = feature
        tensors[f"output.stage{stage + 1}.p_text"] = p_text
        tensors[f"output.stage{stage + 1}.p_text_softmax"] = double
        tensors[f"output.stage{stage + 1}.vision_logits"] = vision_logits
        tensors[f"output.stage{stage + 1}.p_vision"] = softmax_calls[2 * stage + 1][1]
        tensors[f"output.stage{stage + 1}.fused"] = fused[stage]
        tensors[f"state.stage{stage + 1}.classifier_init"] = classifier_calls[stage][1]
    return Golden(
        component="mg_clip.fusion",
        official=MINDTHEGAP,
        file="main.py",
        function="run_class_incremental (its evaluation: combined_outputs); continual_clip/models.py "
        "ClassIncrementalCLIP.forward, forward_clip, VisionClassifier",
        loading=(
            "main.py and continual_clip/models.py, utils.py imported as is; stubbed: hydra, omegaconf, "
            "continuum (Logger, rehearsal), sklearn.cluster, clip (tokenize: prompt -> class id), "
            "clip.model, loraclip.lora_clip.load (returns a stub CLIP whose encode_image / encode_text "
            "return seeded features of the sample / class), continual_clip.datasets.build_cl_scenarios "
            "(seeded tasks of sample ids). Observed, not changed: main.VisionClassifier is a subclass "
            "that records its set_weight / add_weight arguments and its evaluation calls; main.F is "
            "torch.nn.functional with softmax recording its input and output and returning a tensor "
            "subclass that logs the arithmetic on it (the fused scores are the 'div' results)"
        ),
        seed=SEED,
        sizes={"tasks": 2, "classes_per_task": per_task, "dim": FUSION_DIM, "samples": ids},
        tensors=tensors,
        notes=(
            "cfg: configs/class/cifar100_10-10.yaml's fields at a small size: epochs 0 (no LoRA "
            "training; the stub's towers are fixed), visual agent on with the suite's visual_lr, "
            "visual_batch_size and visual_epochs (5e-4, 64, 3), prompt 'a good photo of a {}.', "
            "class order " + str(FUSION_ORDER) + ". Per stage s (after task s): the classifier W "
            "the evaluation used, its rows' initial values (class means of the normalised features), "
            "p_text (ClassIncrementalCLIP.forward(test=True): softmax of s<v,t> over seen classes), "
            "p_text_softmax (main.py's second softmax), vision_logits (VisionClassifier: "
            "<v/|v|, w/|w|>), p_vision, fused = (1 * p_text_softmax + 4 * p_vision) / 5."
        ),
    )


# ============================================================================ mg_clip.epoch_probe
PROBE_CLASSES, PROBE_DIM = 4, 32
# name: (samples, batch size, drift per epoch, images start on the far side of the texts' mean)
PROBE_SCENARIOS = {
    "crosses_at_3": (16, 8, 0.16, False),  # relative moves 0.031, 0.057, 0.082, 0.106: budget 3
    "crosses_at_0": (16, 8, 1.2, False),  # 0.177 after the first epoch: budget 1
    "never_crosses": (16, 8, 0.0, False),  # |moves| <= 0.003: no decision in 10 epochs
    "partial_batch": (14, 4, 0.16, False),  # batches of 4, 4, 4, 2: the batch means weigh unequally
    "negative_gap": (16, 8, 0.2, True),  # non-target logits < 0 before training
}


def _probe_inputs(samples: int, drift: float, anti: bool, generator: torch.Generator):
    """Text features sharing a common direction u (CLIP's texts are close to each other), image
    features near their class's text plus a multiple of u that grows by ``drift`` every epoch (the
    modality gap moving); 11 states: before training and after each of 10 epochs."""
    u = F.normalize(torch.randn(PROBE_DIM, generator=generator), dim=0)
    texts = 3.0 * u + torch.randn(PROBE_CLASSES, PROBE_DIM, generator=generator)
    labels = torch.arange(samples) % PROBE_CLASSES
    base = 2.0 * F.normalize(texts, dim=-1)[labels] + 0.3 * torch.randn(
        samples, PROBE_DIM, generator=generator
    )
    noise = 0.01 * torch.randn(11, samples, PROBE_DIM, generator=generator)
    start = -2.0 if anti else 2.0
    images = torch.stack([base + (start + epoch * drift) * u for epoch in range(11)]) + noise
    return texts, labels, images


@component("mg_clip.epoch_probe", MINDTHEGAP)
def epoch_probe(checkout: Path) -> Golden:
    from strategies.methods.mg_clip import MGCLIPConfig

    cfg_suite = MGCLIPConfig()
    logit_scale = suite_logit_scale()
    tensors: dict[str, torch.Tensor] = {"param.logit_scale": logit_scale}
    names = [f"class{i}" for i in range(PROBE_CLASSES)]
    prompts = {TEMPLATE.format(name): i for i, name in enumerate(names)}
    messages: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    for scenario, (samples, batch, drift, anti) in PROBE_SCENARIOS.items():
        texts, labels, images = _probe_inputs(samples, drift, anti, torch.Generator().manual_seed(SEED))
        stub = StubCLIP(images, texts, logit_scale)
        train = Tasks([TensorDataset(torch.arange(samples), labels, torch.zeros_like(labels))])
        lrs: list[float] = []
        messages.clear()
        handler, root = Handler(), logging.getLogger()
        level = root.level
        step_hook = register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: lrs.append(optimizer.param_groups[0]["lr"])
        )
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
                cfg = runner_config(
                    Path(tmp),
                    list(range(PROBE_CLASSES)),
                    dataset="cifar100",
                    batch_size=batch,
                    train_batch_size=batch,
                    increment=PROBE_CLASSES,
                    initial_increment=PROBE_CLASSES,
                    task_num=1,
                    seed=42,
                    epochs=1,
                    lr=cfg_suite.lr,
                    visual_agent=False,
                )
                stubs = run_stubs(checkout, stub, prompts, train, Tasks([train[0]]), names)
                with official_import_path(checkout, stubs) as load:
                    load("continual_clip/models.py", "continual_clip.models")
                    probe = load("epoch.py", "mindthegap_epoch")
                    torch.manual_seed(SEED)  # the loaders' shuffles
                    try:
                        probe.run_class_incremental(cfg, torch.device("cpu"))
                        stopped = False
                    except SystemExit:  # epoch.py's exit(0) after the decision
                        stopped = True
        finally:
            step_hook.remove()
            root.removeHandler(handler)
            root.setLevel(level)

        def values(prefix: str) -> list[float]:
            # a 0-d tensor in an f-string formats as its Python float: the value to the last bit
            return [float(m.split(": ", 1)[1]) for m in messages if m.startswith(prefix)]

        decisions = [m for m in messages if m.startswith("Negative records changed too much")]
        budget = int(decisions[0].rsplit(" ", 1)[1]) if decisions else -1
        assert stopped == bool(decisions)
        measured = [ids for grad, _, ids in stub.calls if not grad]  # every evaluation batch, in order
        batches_per_pass = -(-samples // batch)
        key = f"{scenario}."
        tensors[f"input.{key}text_features"] = texts
        tensors[f"input.{key}labels"] = labels
        tensors[f"input.{key}image_features"] = images
        tensors[f"input.{key}measured_ids"] = torch.stack(
            [torch.cat(measured[i : i + batches_per_pass]) for i in range(0, len(measured), batches_per_pass)]
        )
        tensors[f"input.{key}batch_size"] = torch.tensor(batch)
        tensors[f"output.{key}negative_records"] = torch.tensor(
            values("negative_records:"), dtype=torch.float64
        )
        tensors[f"output.{key}positive_records"] = torch.tensor(
            values("positive_records:"), dtype=torch.float64
        )
        tensors[f"output.{key}negative_mean"] = torch.tensor(values("negative_mean:"), dtype=torch.float64)
        tensors[f"output.{key}positive_mean"] = torch.tensor(values("positive_mean:"), dtype=torch.float64)
        tensors[f"output.{key}budget"] = torch.tensor(budget)
        tensors[f"output.{key}lr"] = torch.tensor(lrs, dtype=torch.float64)
    return Golden(
        component="mg_clip.epoch_probe",
        official=MINDTHEGAP,
        file="epoch.py",
        function="run_class_incremental (the gap before training, one measurement after each of 10 "
        "epochs, exit(0) at the first relative move > 0.1)",
        loading=(
            "epoch.py and continual_clip/models.py, utils.py imported as is (ClassIncrementalCLIP and "
            "forward_clip make the logits); stubbed: hydra, omegaconf, continuum, sklearn.cluster, clip "
            "(tokenize: prompt -> class id), clip.model, loraclip.lora_clip.load (a stub CLIP whose "
            "encode_image returns seeded per-epoch features of the sample ids, the state after the "
            "model's k-th switch to eval mode; one zero-gradient parameter for Adam), "
            "continual_clip.datasets.build_cl_scenarios. Observed: the logged values (a 0-d tensor in "
            "an f-string prints its exact float), the decision message, SystemExit from exit(0), the lr "
            "of every optimiser step (a global step pre-hook), the sample ids of every measurement batch"
        ),
        seed=SEED,
        sizes={"classes": PROBE_CLASSES, "dim": PROBE_DIM, "scenarios": len(PROBE_SCENARIOS)},
        tensors=tensors,
        notes=(
            "Scenarios " + ", ".join(PROBE_SCENARIOS) + ". output.<s>.budget: the epoch of the official "
            "'Negative records changed too much, epoch N' message (-1: none in 10 epochs, the official "
            "loop then goes on to the next task; with one task it returns). negative_mean[k]: the "
            "measurement after epoch k+1; negative_records: before training. Each is the mean over the "
            "shuffled batches of the batch mean of (sum of non-target logits / (C - 1)). "
            "input.<s>.measured_ids[m]: the sample ids of measurement m, batches concatenated in order. "
            "output.<s>.lr: the lr of every optimiser step (Adam, CosineAnnealingLR(T_max=10, "
            "eta_min=0.01 lr) stepped per epoch)."
        ),
    )
