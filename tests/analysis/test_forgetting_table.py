"""The report's forgetting table: per strategy and dataset, mean ± std over seeds of the stored
forgetting and BWT, the least forgetting and the highest BWT marked best."""

from analysis.paper_inputs import ReportInputs
from analysis.paper_tables import table_forgetting
from tests.analysis.records import run_result


def _run(label, seed, forgetting, bwt):
    return run_result(label, "cifar100", 10, seed, summary={"forgetting": forgetting, "bwt": bwt})


def test_cells_and_marks_follow_each_metrics_direction():
    runs = [
        _run("gr4cil", 0, 10.0, -8.0),
        _run("gr4cil", 1, 14.0, -12.0),  # forgetting 12 ± 2, BWT -10 ± 2
        _run("finetune", 0, 30.0, -30.0),
        _run("finetune", 1, 30.0, -30.0),
        _run("continual_clip", 0, 5.0, -20.0),  # forgets least, yet not the best BWT
        _run("continual_clip", 1, 5.0, -20.0),
    ]
    rendered = table_forgetting(ReportInputs(runs, runs)).render()
    cells = {name: dict(zip(("forgetting", "bwt"), row_cells)) for name, _, row_cells, _ in rendered.rows}
    marks = {name: dict(zip(("forgetting", "bwt"), row_marks)) for name, _, _, row_marks in rendered.rows}
    assert cells["GR4CIL"] == {"forgetting": "12.00 ± 2.00", "bwt": "-10.00 ± 2.00"}
    # forgetting: lower is better; BWT: higher is better
    assert marks["Continual-CLIP"]["forgetting"] == "best" and marks["GR4CIL"]["forgetting"] == "second"
    assert marks["GR4CIL"]["bwt"] == "best" and marks["Continual-CLIP"]["bwt"] == "second"
    assert "lower is better for Forgetting, higher otherwise" in rendered.to_markdown()
