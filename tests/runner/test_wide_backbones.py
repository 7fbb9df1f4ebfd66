"""Strategies at other widths than ViT-B/16's, as ``python -m benchmarks.tools.walk --backbone MODEL``
walks them: a randomly initialised ViT-L/14 (images 1024 wide, text 768, 24 image blocks: prompt
layers, expert counts, LoRA targets and the attention surgery at those sizes) and ViT-B/32 (patch
32), fast dev runs of 2 tasks on fake CIFAR-100. The walk over all twelve strategies is a command
(docs/running.md, Weights); here a few that size something by the model."""

import pytest

from benchmarks.runner.reading import iter_results
from benchmarks.tools import walk

pytestmark = [pytest.mark.slow, pytest.mark.spread]  # each model on any worker: they share fake_root only

# MOE4CL: experts and routers on every block; CODA-Prompt: prompts in the image blocks by index (the
# walk runs the other ten there, minutes each on 2 cores); MG-CLIP: LoRA on both towers, patch 32
WIDE = {"ViT-L-14": "moe4cl,coda_prompt", "ViT-B-32": "mg_clip"}


@pytest.mark.parametrize("model", list(WIDE))
def test_strategies_build_and_run_on_the_models_widths(model, fake_root, tmp_path, capsys):
    argv = ["--data-root", str(fake_root), "--results-dir", str(tmp_path), "--suites", "main"]
    argv += ["--backbone", model, "--strategies", WIDE[model], "--datasets", "cifar100", "--tasks", "2"]
    assert walk.main(argv) == 0, capsys.readouterr().err
    results = {r["label"]: r for _, r in iter_results(tmp_path / "main")}
    assert sorted(results) == sorted(WIDE[model].split(","))
    for result in results.values():
        assert result["config"]["backbone"] == {"model": model, "pretrained": None}
        assert "weights_file" not in result["config"]  # a random init loads no file
        assert len(result["stages"]) == 2 and result["cost"]["trainable_params"] > 0
    assert (tmp_path / "suites" / "main.toml").read_text().startswith('base = "main"')
