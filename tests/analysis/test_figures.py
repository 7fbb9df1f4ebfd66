"""The line figures' styles: every method has its own colour and marker, a label outside the
registry never takes a registered method's, and GR4CIL is drawn on top in a heavier line."""

import matplotlib
import numpy as np
import pytest

from analysis import figure_style, figures
from analysis.figure_style import METHOD_STYLES, method_styles, save_figure
from analysis.paper_inputs import PAPER_METHOD_NAMES, ReportInputs, row_label
from strategies.registry import available
from tests.analysis.records import run_result, stage_result

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
        run_result(
            label,
            "cifar100",
            n_tasks,
            seed,
            stages=[stage_result(t, 90.0 - 10 * t - i - seed) for t in range(1, n_tasks + 1)],
        )
        for i, label in enumerate(labels)
        for seed in seeds
    ]


@pytest.fixture
def drawn(monkeypatch):
    """The Figure a figure function draws, instead of the files it would write."""
    figs = []

    def keep(fig, out_dir, name, caveat=None):
        fig.caveat = caveat  # what the real save_figure would write under it
        figs.append(fig)
        return []

    # the report's figures call save_figure through analysis.figures, the comparison's through figure_style
    monkeypatch.setattr(figures, "save_figure", keep)
    monkeypatch.setattr(figure_style, "save_figure", keep)
    return figs


def test_gr4cil_is_drawn_on_top_in_a_heavier_line(drawn, tmp_path):
    labels = ["adaptervlm", "gr4cil", "moe4cl", "my_pkg.methods:MyStrategy", "zeta"]  # GR4CIL in the middle
    runs = _runs(labels)
    figures.fig_accuracy_curves(ReportInputs(runs, runs), tmp_path)
    (ax,) = [ax for ax in drawn[0].axes if ax.get_visible()]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {figure_style.short_label(row_label(label)) for label in labels}  # MyStrategy
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
    assert [text.get_text() for text in legend.get_texts()] == [
        figure_style.short_label(name) for name in sorted(row_label(label) for label in labels)
    ]


def test_a_figure_of_the_synthetic_world_says_below_it_that_it_ranks_nothing(drawn, tmp_path):
    real = _runs(["gr4cil", "mine"])
    offline = [
        run_result(
            r.label,
            "synthetic",
            r.n_tasks,
            r.seed,
            stages=r.stages,
            config={"backbone": {"model": "tiny-clip-32"}},
        )
        for r in real
    ]
    figures.fig_accuracy_curves(ReportInputs(real, real), tmp_path)
    figures.fig_accuracy_curves(ReportInputs(offline, offline), tmp_path)
    assert [fig.caveat for fig in drawn] == [
        None,
        "On the synthetic world with the tiny CLIP: not a ranking of methods",
    ]
    # the line is drawn in grey above everything else, in a strip the figure grows by
    height = drawn[1].get_figheight()
    (png, _) = save_figure(drawn[1], tmp_path, "curves", caveat=drawn[1].caveat)  # the real one
    assert [t.get_text() for t in drawn[1].texts][-1] == drawn[1].caveat
    assert drawn[1].get_figheight() == pytest.approx(height + figure_style.CAVEAT_STRIP)
    image = matplotlib.image.imread(png)[..., :3]
    inked = np.flatnonzero((image < 0.9).any(axis=(1, 2)))  # rows with anything drawn
    top = image[inked[0] : inked[0] + 5]  # the top of the highest line of ink
    assert inked[0] > 0 and (top < 0.9).any()  # a margin over it: not cut off
    assert top[(top < 0.9).any(axis=-1)].min() > 0.3  # dim grey (0.41): the caveat, not the black title


LONG_LABELS = ["avalanche:LwF", "pycil:my_pkg.mod:NCM", "my_strategy.strategy:MyStrategy"]


def test_module_class_labels_are_shortened_to_the_class_name():
    assert [figure_style.short_label(label) for label in LONG_LABELS] == ["LwF", "NCM", "MyStrategy"]
    assert figure_style.short_label("gr4cil") == "gr4cil" and figure_style.short_label("tau0.5") == "tau0.5"
    # two labels that would show the same name keep their own
    assert figure_style.legend_names(["avalanche:LwF", "my_pkg:LwF", "gr4cil"]) == {
        "avalanche:LwF": "avalanche:LwF",
        "my_pkg:LwF": "my_pkg:LwF",
        "gr4cil": "gr4cil",
    }


def _legend_inside_the_figure_and_off_the_axes(fig):
    """Draw ``fig`` (its layout engine runs) and check each legend: whole within the figure, and
    overlapping no panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    figure_box = fig.bbox
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1, (box, figure_box)
    assert figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1, (box, figure_box)
    for text in legend.get_texts():  # no text cut at the figure's edge
        extent = text.get_window_extent(renderer)
        assert figure_box.x0 <= extent.x0 and extent.x1 <= figure_box.x1
    for ax in fig.axes:
        if ax.get_visible():
            assert not box.overlaps(ax.get_window_extent(renderer)), "the legend lies on a panel"
    return [text.get_text() for text in legend.get_texts()]


def test_accuracy_curves_legend_is_outside_with_short_labels_and_equal_curves_stay_visible(drawn, tmp_path):
    labels = [
        "gr4cil",
        "adaptervlm",
        "mg_clip",
        *LONG_LABELS,
        "my_pkg.a_long_module_name:AnotherLongStrategyName",
    ]
    runs = _runs(labels)
    for run in runs:  # MG-CLIP's curve made AdapterVLM's
        if run.label == "mg_clip":
            run.stages = next(r for r in runs if r.label == "adaptervlm" and r.seed == run.seed).stages
    figures.fig_accuracy_curves(ReportInputs(runs, runs), tmp_path)
    names = _legend_inside_the_figure_and_off_the_axes(drawn[0])
    assert set(names) == {
        "GR4CIL",
        "AdapterVLM",
        "MG-CLIP",
        "LwF",
        "NCM",
        "MyStrategy",
        "AnotherLongStrategyName",
    }
    (ax,) = [ax for ax in drawn[0].axes if ax.get_visible()]
    lines = {line.get_label(): line for line in ax.get_lines()}
    first, second = lines["AdapterVLM"], lines["MG-CLIP"]
    assert list(first.get_ydata()) == list(second.get_ydata())  # the same values ...
    # ... drawn so that both show: another marker, and the later one dashed over the solid first
    assert first.get_marker() != second.get_marker()
    assert (first.get_linestyle(), second.get_linestyle()) == ("-", "--")


@pytest.mark.parametrize("same_curve", [False, True])
def test_a_comparison_draws_the_strategy_as_clearly_as_the_baseline(drawn, tmp_path, same_curve):
    import numpy as np

    from analysis.comparison_output import draw_figure
    from analysis.pairing import Comparison
    from analysis.statistics import Interval

    label, baseline = "pycil:my_pkg.mod:NCM", "gr4cil"
    band = np.array([[90.0, 80.0, 70.0], [88.0, 78.0, 68.0], [92.0, 82.0, 72.0]])  # mean, low, high
    comparison = Comparison(
        "cifar100", 3, label, baseline, "last", {0: 70.0}, {0: 70.0}, [0], 0.0, Interval(0.0, -1.0, 1.0, 0.5)
    )
    comparison.stage_bands = {baseline: band, label: band if same_curve else band - 5.0}
    draw_figure([comparison], label, tmp_path)
    assert _legend_inside_the_figure_and_off_the_axes(drawn[0]) == ["NCM", "gr4cil"]
    lines = {line.get_label(): line for line in drawn[0].axes[0].get_lines()}
    mine, theirs = lines["NCM"], lines["gr4cil"]
    assert mine.get_color() != theirs.get_color() and theirs.get_linestyle() == "-"
    assert mine.get_linewidth() >= 1.0 and mine.get_zorder() > theirs.get_zorder()  # on top of it
    if same_curve:  # over the baseline's heavier line, dashed: both show
        assert mine.get_marker() != theirs.get_marker() and mine.get_linestyle() == "--"
    else:
        assert mine.get_linestyle() == "-"  # solid, as the baseline
