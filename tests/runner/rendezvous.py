"""A test plugin for workers that share one tune: the first task each process trains waits until
``parties`` processes have reached theirs, so the workers' trials are certainly under way at once,
however the processes' starts fall. It changes no number."""

import os
import socket
import time
from pathlib import Path

from avalanche.core import SupervisedPlugin

_arrived = False  # this process has reached the rendezvous


class Rendezvous(SupervisedPlugin):
    survives_resume = True  # it keeps nothing (strategies.contract.plugins_survive_resume)

    def __init__(self, folder: str, parties: int = 2, timeout: float = 120.0):
        super().__init__()
        self.folder, self.parties, self.timeout = Path(folder), parties, timeout

    def before_training_exp(self, strategy, *args, **kwargs):
        global _arrived
        if _arrived:
            return
        _arrived = True
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{socket.gethostname()}-{os.getpid()}").touch()
        deadline = time.monotonic() + self.timeout
        while len(list(self.folder.iterdir())) < self.parties:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rendezvous: {self.parties} processes never met in {self.folder}")
            time.sleep(0.2)
