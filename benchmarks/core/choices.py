"""The fixed choices the command line offers, importing nothing heavy.

``python -m benchmarks.run --help`` and a refused option answer from these names alone, without
torch, Avalanche or open_clip (seconds on a loaded machine); the modules that act on a choice
import it from here, so each list is written once.
"""

from __future__ import annotations

import typing
from typing import Literal

from benchmarks.core.errors import UserError

#: a run's numeric precision (``benchmarks.core.precision``)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

#: where a run's train and eval pixels are computed: "device" (``benchmarks.data.device_augment``,
#: where it covers the augmentation) or "pil" (torchvision's PIL pipeline, per sample); the two
#: give the same pixels
AugmentOn = Literal["device", "pil"]
AUGMENT_ON: tuple[str, ...] = typing.get_args(AugmentOn)


def check_augment_on(value: object) -> AugmentOn:
    """``value`` if it is an ``AugmentOn``, else one line naming the choices. A run's value is
    checked once, where it enters (``benchmarks.runner.suites.expand``), and travels typed."""
    if value not in AUGMENT_ON:
        raise UserError(f"augment_on must be one of {', '.join(AUGMENT_ON)}, not {value!r}")
    return typing.cast(AugmentOn, value)


#: where a suite's runs execute (``benchmarks.runner.launcher``)
LAUNCHERS = ("inline", "local", "slurm")

#: the command whose rates turn a dry run's runs into GPU-hours (``benchmarks.runner.gpu_hours``)
GPU_CHECK_COMMAND = "python -m benchmarks.tools.gpu_check"

#: the seeds a run may have: each seeds numpy's ``RandomState([seed, class])`` (below 2**32) and
#: ``torch.manual_seed`` (``benchmarks.core.environment.seed_everything``)
MAX_SEED = 2**32 - 1

#: what ``benchmarks.tune`` maximises: a run's validation metric of that name, averaged over its runs
OBJECTIVES = {"val_avg": "avg_acc", "val_last": "last_acc"}

#: the share of each class's training images a tune holds out when its suite names none
DEFAULT_VALIDATION_FRACTION = 0.1
#: a validation split holds at most half of a class's training images
MAX_VALIDATION_FRACTION = 0.5
