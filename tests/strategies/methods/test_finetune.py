"""``strategies.methods.finetune``: one LoRA trained task after task on a frozen CLIP, scored over every
class seen so far."""

import torch

from benchmarks.backbone import BackboneSpec, create_clip
from strategies.registry import get_strategy
from strategies.settings import RunSettings
from tests.helpers import seeded_order_stream


def test_finetune_trains_only_its_lora_and_scores_all_seen_classes(small_data):
    torch.manual_seed(0)
    stream = seeded_order_stream(small_data)
    backbone = create_clip(BackboneSpec("tiny-clip-32", None))
    base = {k: v.clone() for k, v in backbone.model.state_dict().items() if "lora" not in k}
    cls = get_strategy("finetune")
    strategy = cls(
        backbone=backbone,
        class_names=stream.class_names,
        config=cls.Config(epochs=1, batch_size=16, lora_rank=4, lora_alpha=4.0),
        settings=RunSettings(show_progress=False),
    )
    for task in range(2):
        strategy.learn(stream.train_stream[task])
    assert strategy.seen_classes == sorted(stream.tasks[0]) + sorted(stream.tasks[1])
    after = {
        k.replace(".base_layer", ""): v for k, v in backbone.model.state_dict().items() if "lora" not in k
    }
    assert after.keys() == base.keys()
    assert all(torch.equal(value, after[key]) for key, value in base.items())  # base frozen
    lora_b = strategy.backbone.lora_state_dict("visual")
    assert any(v.abs().sum() > 0 for k, v in lora_b.items() if "lora_B" in k)  # adapter learned
    scores = strategy.evaluate_dataset(stream.test_set)
    assert scores.shape == (200, 20)
    # scores are cosines of normalised features
    assert scores.abs().max() <= 1.0 + 1e-5
    tensors, meta = strategy.checkpoint_state()
    assert meta["seen_classes"] == strategy.seen_classes and all(k.startswith("lora/") for k in tensors)
