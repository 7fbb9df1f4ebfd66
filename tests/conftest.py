import pytest
import torch


TORCH_DEFAULT_THREADS = torch.get_num_threads()  # what a command-line run uses


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_test_process():
    # Small matmuls on 2 shared cores run faster on one thread than fighting over two.
    torch.set_num_threads(1)


def write_suite(path, text: str):
    path.write_text(text)
    return str(path)


MINI_SUITE = """
datasets = ["synthetic"]
tasks = [5]
seeds = [0]
strategies = ["continual_clip", "finetune"]
device = "cpu"
[backbone]
model = "tiny-clip-32"
pretrained = "synthetic"
[dataset.synthetic]
n_train_per_class = 10
n_test_per_class = 4
[defaults]
batch_size = 32
eval_batch_size = 200
lora_rank = 4
lora_alpha = 4.0
[strategy.finetune]
epochs = 2
"""


@pytest.fixture
def mini_suite(tmp_path):
    """A 5-task, 100-class synthetic suite that runs in seconds."""
    return write_suite(tmp_path / "mini.toml", MINI_SUITE)


def kill_in_task(monkeypatch, strategy_cls, task: int = 3):
    """Make ``strategy_cls.learn`` raise KeyboardInterrupt (a kill) when it starts task ``task``;
    call the returned function to let it learn normally again."""
    real_learn = strategy_cls.learn
    calls = {"n": 0}

    def dying_learn(self, experience):
        calls["n"] += 1
        if calls["n"] == task:
            raise KeyboardInterrupt
        return real_learn(self, experience)

    monkeypatch.setattr(strategy_cls, "learn", dying_learn)
    return lambda: monkeypatch.setattr(strategy_cls, "learn", real_learn)
