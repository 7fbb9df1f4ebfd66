"""``benchmarks.tools.loader_speed``: images a second of the data loader and of training, for each
worker count, written as JSON."""

import json

import pytest

from benchmarks.tools import loader_speed as loading


def test_loading_benchmark_reports_images_per_second_for_each_worker_count(tmp_path):
    out = tmp_path / "loading.json"
    results = loading.main(
        [
            "--workers",
            "0,2",
            "--epochs",
            "1",
            "--train-per-class",
            "4",
            "--batch-size",
            "8",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert [row["loader_workers"] for row in results["rows"]] == [0, 2]
    for row in results["rows"]:
        assert (
            row["images"] == 40
            and row["loader_images_per_second"] > 0
            and row["training_images_per_second"] > 0
        )
        assert row["seeding_cost"] == pytest.approx(
            row["plain_loader_images_per_second"] / row["loader_images_per_second"]
        )
    assert results["rows"][0]["training_speedup"] == 1.0
