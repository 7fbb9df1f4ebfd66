"""The line figures' styles: every method has its own colour and marker, a label outside the
registry never takes a registered method's, and GR4CIL is drawn on top in a heavier line."""

import matplotlib
import pytest

from analysis import figures
from analysis.figures import METHOD_STYLES, method_styles
from analysis.paper_inputs import PAPER_METHOD_NAMES, ReportInputs, row_label
from strategies.registry import available

matplotlib.use("Agg")  # the figures draw on Figure objects; nothing here needs a display

UNKNOWN = ["my_pkg.methods:MyStrategy", "gr4cil-base", "full", "v01", "v02", "v03", "v04", "v05"]


def test_every_registered_strategy_has_its_own_colour_and_marker():
    strategies = available()
    # the paper's methods keep one style in every figure; a strategy added later (one file, no edit
    # here) takes a fallback, still its own
    assert set(PAPER_METHOD_NAMES) <= set(METHOD_STYLES)
    for labels in (strategies, [row_label(s) for s in strategies]):  # run labels or row labels
        styles = method_styles(labels).values()
        assert len({s.color for s in styles}) == len({s.marker for s in styles}) == len(strategies)


def test_labels_outside_the_registry_never_take_a_registered_style():
    styles = method_styles([*available(), *UNKNOWN])  # 20 methods
    fallbacks = [styles[label] for label in UNKNOWN]
    registered = METHOD_STYLES.values()
    assert len({s.color for s in styles.values()}) == len({s.marker for s in styles.values()}) == len(styles)
    assert not {s.color for s in fallbacks} & {s.color for s in registered}
    assert not {s.marker for s in fallbacks} & {s.marker for s in registered}
    # deterministic: the same label set gives the same styles, whatever order it comes in
    assert method_styles(reversed([*UNKNOWN, "gr4cil"])) == {
        label: styles[label] for label in [*UNKNOWN, "gr4cil"]
    }


def _runs(labels, seeds=(0, 1), n_tasks=3):
    return [
        {
            "label": label,
            "dataset": "cifar100",
            "n_tasks": n_tasks,
            "seed": seed,
            "stages": [{"task": t, "acc": 90.0 - 10 * t - i - seed} for t in range(1, n_tasks + 1)],
        }
        for i, label in enumerate(labels)
        for seed in seeds
    ]


@pytest.fixture
def drawn(monkeypatch):
    """The Figure a figure function draws, instead of the files it would write."""
    figs = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, out_dir, name: figs.append(fig) or [])
    return figs


def test_gr4cil_is_drawn_on_top_in_a_heavier_line(drawn, tmp_path):
    labels = ["adaptervlm", "gr4cil", "moe4cl", "my_pkg.methods:MyStrategy", "zeta"]  # GR4CIL in the middle
    runs = _runs(labels)
    figures.fig_accuracy_curves(ReportInputs(runs, runs), tmp_path)
    (ax,) = [ax for ax in drawn[0].axes if ax.get_visible()]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {row_label(label) for label in labels}
    top = ax.get_lines()[-1]
    assert top.get_label() == "GR4CIL"  # drawn last ...
    others = [line for line in ax.get_lines() if line is not top]
    assert top.get_zorder() > max(line.get_zorder() for line in others)  # ... and above the rest
    assert top.get_linewidth() > max(line.get_linewidth() for line in others)
    assert (
        len({line.get_color() for line in lines.values()})
        == len({line.get_marker() for line in lines.values()})
        == 5
    )
    # the legend lists every method once, in label order, under the panels
    (legend,) = drawn[0].legends
    assert [text.get_text() for text in legend.get_texts()] == sorted(row_label(label) for label in labels)
