"""Why CLAP ends below zero-shot on the miniature: ``python -m benchmarks.miniature.clap_diagnosis``.

On smoke-baselines' world and recipe (seed 0, or ``--seed``), it measures:

1. before any training, on the same test images: zero-shot CLIP with CLAP's own text features (the
   template ensemble), CLAP's scores, and CLAP's scores without each added term (the VGA's output,
   the sampled residual z), with the norms of the terms beside t_c's;
2. after each of the first ``--tasks`` tasks: accuracy over the seen classes, and per task its
   accuracy, its accuracy among its own classes only (task identity given), and the mean score of
   its classes' columns over every seen test image; then the same with the VGA put back as it was
   after the previous task, which tells the shared VGA's part from the new task encoder's.

``--epochs`` overrides the recipe's (5; 50 gives CIFAR-100's step count, docs/miniature.md).
Numbers in docs/miniature.md come from this command.
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch

from benchmarks.core.environment import seed_everything
from benchmarks.core.errors import CommandParser, one_line_user_errors
from benchmarks.core.metrics import predicted_classes
from benchmarks.runner.building import build_run, resolve
from benchmarks.runner.suites import expand, load_suite
from strategies.methods.clap import CLAP, task_mask


def accuracy(scores: torch.Tensor, columns: list[int], targets: torch.Tensor) -> float:
    """Percent of ``targets`` whose top-scoring column's class (``columns``) is the target."""
    return float((predicted_classes(scores.numpy(), columns) == targets.numpy()).mean() * 100)


def untrained(clap, tasks: list[list[int]]):
    """A copy of ``clap`` with every task's encoder set up as at its task, nothing trained."""
    copy_ = copy.deepcopy(clap)
    for i, task in enumerate(tasks):
        copy_.setup_task(i, task)
        copy_.task_classes.append(task)
        copy_.seen_classes = copy_.seen_classes + task
    return copy_


def build(seed: int, epochs: int | None, suite: str = "smoke-baselines", n_tasks: int = 10):
    """CLAP as the runner builds it for ``suite`` (seed ``seed``), its stream and test features."""
    (spec,) = expand(load_suite(suite), strategies=["clap"], seeds=[seed], tasks=[n_tasks], device="cpu")
    resolved = resolve(spec, "data")
    if epochs is not None:
        resolved = dataclasses.replace(
            resolved, strategy_cfg=dataclasses.replace(resolved.strategy_cfg, epochs=epochs)
        )
    built = build_run(resolved, "data")
    clap, stream = built.strategy, built.stream
    assert isinstance(clap, CLAP)  # the suite's clap row
    features = clap.frozen_features(stream.test_set, "test", None).float()
    return clap, stream, features, torch.tensor(stream.test_targets)


@torch.no_grad()
def before_training(clap, stream, features, targets) -> dict[str, float]:
    """Zero-shot with CLAP's text features, and untrained CLAP with and without its added terms,
    over every class (each task's encoder initialised as at its task)."""
    tasks = stream.tasks
    classes = [c for task in tasks for c in task]
    text = clap.class_text(classes)
    scale = clap.backbone.logit_scale
    out = {"zero-shot": accuracy(scale * features @ text.T, classes, targets)}
    fresh = untrained(clap, tasks)
    fresh.vga.eval()
    out["CLAP untrained"] = accuracy(fresh.scores_from_features(features), classes, targets)
    queries = text.unsqueeze(0).expand(len(features), -1, -1)
    vga = fresh.vga(queries, features.unsqueeze(1), tgt_mask=task_mask([len(t) for t in tasks], "cpu"))
    out["CLAP untrained, z = 0 (t + VGA)"] = accuracy(
        scale * torch.einsum("bd,bcd->bc", features, queries + vga), classes, targets
    )
    out["|t_c|"] = float(text.norm(dim=-1).mean())
    out["|VGA_c|"] = float(vga.norm(dim=-1).mean())
    return out


@torch.no_grad()
def stage_report(clap, features, targets) -> dict:
    """Accuracy over the seen classes, and per task: accuracy, accuracy within its own classes, and
    the mean score of its columns over the seen classes' test images."""
    seen = clap.seen_classes
    in_seen = torch.isin(targets, torch.tensor(seen))
    scores = clap.scores_from_features(features[in_seen])  # frozen features come normalised
    labels = targets[in_seen]
    tasks: list[dict] = []
    report = {"acc": accuracy(scores, seen, labels), "tasks": tasks}
    for task in clap.task_classes:
        mine = torch.isin(labels, torch.tensor(task))
        columns = [seen.index(c) for c in task]
        tasks.append(
            {
                "acc": accuracy(scores[mine], seen, labels[mine]),
                "within_task": accuracy(scores[mine][:, columns], task, labels[mine]),
                "mean_score": float(scores[:, columns].mean()),
            }
        )
    return report


def _line(tag: str, report: dict) -> str:
    tasks = "; ".join(
        f"task {i + 1}: {t['acc']:.1f} (own classes {t['within_task']:.1f}, mean score {t['mean_score']:.1f})"
        for i, t in enumerate(report["tasks"])
    )
    return f"{tag}: acc {report['acc']:.1f} | {tasks}"


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="python -m benchmarks.miniature.clap_diagnosis", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=2, help="tasks to train (default 2)")
    parser.add_argument("--epochs", type=int, help="epochs per task (default: the recipe's 5)")
    args = parser.parse_args(argv)
    clap, stream, features, targets = build(args.seed, args.epochs)
    print(f"CLAP on smoke-baselines' world, seed {args.seed}, {clap.cfg.epochs} epochs a task")
    for name, value in before_training(clap, stream, features, targets).items():
        print(f"  before training, {name}: {value:.2f}")
    previous_vga = None
    for task in range(args.tasks):
        seed_everything(args.seed, task)
        clap.learn(stream.train_stream[task])
        print(_line(f"after task {task + 1}", stage_report(clap, features, targets)), flush=True)
        trained_vga = copy.deepcopy(clap.vga.state_dict())
        if previous_vga is not None:
            clap.vga.load_state_dict(previous_vga)
            print(_line("  with the VGA of the task before", stage_report(clap, features, targets)))
            clap.vga.load_state_dict(trained_vga)
        previous_vga = trained_vga
    return 0


if __name__ == "__main__":
    sys.exit(main())
