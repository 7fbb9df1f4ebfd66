"""Device budgets that size batched work: images per inference forward, prompts per text forward
with a graph, and when compact text encoding pays. Pure functions of sizes and the device type."""

from __future__ import annotations

# Activation elements (images x visual tokens x width) that one branch-batched inference forward
# should hold. On a CPU, forwards past cache size cost more per image (2 cores: 640 tiny images
# 1.08-1.47x the time of ten 64-image forwards; ViT-B-16, 16 or 80 images 1.05x per image of 8);
# a GPU wants big batches (256 ViT-B/16 images is 2^25.2; the CUDA value is not measured here).
ACTIVATION_BUDGET = {"cpu": 2**19, "cuda": 2**26}
# Activation elements (prompts x text tokens x width) that one text forward with a graph may hold
# before a training step backpropagates through the text tower in chunks (an extra forward without
# a graph). On a GPU it is sized so that ImageNet-1K's 1000 prompts never chunk with ViT-B/16
# (1000 x 20 x 512 = 2^23.3; about 4 GB of saved fp16 activations); on a CPU memory is plentiful
# but slow, and this keeps the former 256 prompts of ViT-B/16 at 16 tokens.
TEXT_BACKWARD_BUDGET = {"cpu": 2**21, "cuda": 2**25}
# When a device encodes prompts compactly: in length buckets, with the prefix every prompt shares run
# once (both exact). Each bucket and the prefix path add kernel launches and dispatch; they pay only
# when the padded text work, prompts x longest prompt x width^2 (the layers' multiply-adds), is
# large. Measured on 2 CPU cores (benchmarks.tools.speed): a tiny-CLIP stage-1 step with 100 prompts
# (2^23) took 0.09-0.12 s compact against 0.057 s as one batch; forward and backward, 1000 prompts
# take 0.51x (tiny, 2^26.5) and 100 prompts 0.93x (ViT-B/16, 2^29) of one batch, and a ViT-B/16
# step with 100 prompts took 0.98x of a bare step compact against 1.23x as one batch. An H100 is
# bound by launches at every size seen: 1000 ViT-B/16 prompts take 35-50 ms as one batch against
# 555-781 ms compact (and 110 ms for open_clip's 77 positions). None: never compact.
COMPACT_TEXT_MIN_WORK = {"cpu": 2**25, "cuda": None}


def efficient_images_per_forward(tokens_per_image: int, width: int, device_type: str) -> int:
    """How many images fit one inference forward within the device's ``ACTIVATION_BUDGET`` (at least 1)."""
    budget = ACTIVATION_BUDGET.get(device_type, ACTIVATION_BUDGET["cuda"])
    return max(1, budget // (tokens_per_image * width))


def use_compact_text(prompts: int, longest: int, width: int, device_type: str) -> bool:
    """Whether encoding ``prompts`` prompts compactly pays on ``device_type`` (``COMPACT_TEXT_MIN_WORK``)."""
    threshold = COMPACT_TEXT_MIN_WORK.get(device_type)
    return threshold is not None and prompts * longest * width**2 >= threshold


def efficient_prompts_per_backward(tokens_per_prompt: int, width: int, device_type: str) -> int:
    """How many prompts one text forward with a graph may hold within ``TEXT_BACKWARD_BUDGET``
    (at least 1)."""
    budget = TEXT_BACKWARD_BUDGET.get(device_type, TEXT_BACKWARD_BUDGET["cuda"])
    return max(1, budget // (tokens_per_prompt * width))
