"""A test plugin for the real-SLURM tests: in a SLURM job's first life it waits before task 2, so a
requeue or a preemption always lands in the middle of the run, however fast the machine is (the
tiny run would otherwise finish its last tasks within SLURM's KillWait and never resume). It
changes no number, and outside SLURM, or in a later life, it does nothing."""

import os
import time

from avalanche.core import SupervisedPlugin


class PauseFirstLife(SupervisedPlugin):
    survives_resume = True  # it keeps nothing (strategies.contract.plugins_survive_resume)

    def __init__(self, seconds: float = 120.0):
        super().__init__()
        self.seconds = seconds

    def before_training_exp(self, strategy, *args, **kwargs):
        first_life = os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
        if first_life and strategy.clock.train_exp_counter == 1:
            time.sleep(self.seconds)
