"""How every figure of the report looks, apart from what it draws: sizes, the style of each
method's series, legends' names, the seaborn style and the saved files.

Figures are drawn on ``matplotlib.figure.Figure`` objects (no pyplot state) in seaborn's style, at a
fixed size (``panel_figsize``, ``DPI``, and ``analysis.figures.FIGSIZES``): no tight bounding box, so
the PNG is exactly figsize x DPI pixels. Series differ by marker, line style or hatch as well as
colour, so the figures stay readable in greyscale. In the line figures of methods
(``analysis.figures`` and ``analysis.comparison_output``) each method keeps one colour and marker
(``METHOD_STYLES``), and GR4CIL, or the baseline of a comparison, is drawn in a heavier line
(``comparison_styles`` gives a comparison's two). A series whose values equal an earlier one's in
the same panel is drawn dashed over it (``unhidden``), so both stay visible. Legends name a
``module:Class`` strategy by its class (``legend_names``), so no long label pushes a legend past
the figure's edge. ``figure_style`` and ``save_figure`` give every figure the same look and files.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.markers import MarkerStyle

from analysis.paper_inputs import ROW_LABELS
from strategies.cards import cards

DPI = 150
PANEL_SIZE = (3.6, 3.2)  # one panel of fig7_routing and fig_accuracy_curves
MIN_WIDTH = 7.2  # room for the title and the legend when there are only one or two panels
MAX_COLUMNS = 3
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
LINESTYLES = ["-", "--", ":", "-."]
HATCHES = ["", "//", "xx", "..", "\\\\", "oo", "++", "--"]


@dataclass(frozen=True)
class LineStyle:
    """How one series of a line figure is drawn: colour, marker and dash pattern (() is solid)."""

    color: str | tuple[float, float, float]
    marker: str
    dashes: tuple[float, ...] = ()


# Each registered strategy's style in the line figures (fig_accuracy_curves, analysis.compare), the
# same in every figure, from its card (strategies/methods/<name>.toml: matplotlib's tab10 colours,
# black for GR4CIL, navy for fine-tuning, and a marker of its own; a test keeps them all distinct).
METHOD_STYLES = {name: LineStyle(card.color, card.marker) for name, card in cards().items()}
# Labels without a style of their own (a suite variant, a user's module:Class strategy) take these in
# the sorted order of such labels in the figure, dashed: the light partners of the tab10 colours
# (tab20) and markers no registered method uses, so they never look like a registered method. Only
# past 10 such labels do they repeat.
FALLBACK_COLORS = (
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
FALLBACK_MARKERS = ("1", "2", "3", "4", "x", "+", "d", "H", "8", "|")
FALLBACK_DASHES = (4, 1.5)
HIGHLIGHTED_METHOD = "gr4cil"  # drawn on top in a heavier line in fig_accuracy_curves
HIGHLIGHT_LINEWIDTH = 2.4  # the style's lines are 1.2 wide
HIGHLIGHT_ZORDER = 3  # above the other lines (2) and the bands (1)
_STRATEGY_BY_ROW_LABEL = {shown: name for name, shown in ROW_LABELS.items()}
# The comparison figure's colours for a label without a style of its own: strong ones, as clear as
# the baseline's (tab10's blue, red, green, purple)
COMPARISON_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
COMPARISON_MARKERS = ("s", "D")  # filled, as the baseline's: a line-art fallback marker is faint beside it
OVERLAP_DASHES = (3.0, 2.0)  # a series equal to an earlier one: its line shows the earlier one between dashes


def short_label(label: str) -> str:
    """The class name of a ``module:Class`` label (``avalanche:LwF`` -> ``LwF``,
    ``pycil:my_pkg.mod:NCM`` -> ``NCM``); any other label as it is (``gr4cil``, ``tau0.5``)."""
    if ":" not in label:
        return label
    return label.rsplit(":", 1)[1].rsplit(".", 1)[-1] or label


def legend_names(labels: Iterable[str]) -> dict[str, str]:
    """The name each label shows in a legend: ``short_label``, unless two labels of the figure
    would then show the same name (``avalanche:LwF`` beside ``my_pkg:LwF``): those keep their own."""
    labels = list(dict.fromkeys(labels))
    shorts = [short_label(label) for label in labels]
    return {label: short if shorts.count(short) == 1 else label for label, short in zip(labels, shorts)}


def comparison_styles(label: str, baseline: str) -> dict[str, LineStyle]:
    """The styles of a comparison figure's two series: each method's own (``method_styles``), but
    solid, and for a label without a style of its own in a strong colour and a filled marker unlike
    the other's, so the compared strategy is drawn as clearly as the baseline."""
    styles = method_styles([label, baseline])
    for name, other in ((label, baseline), (baseline, label)):
        if styles[name].dashes:  # a fallback: light and dashed among many, too faint beside one other
            color = next(c for c in COMPARISON_COLORS if c != styles[other].color)
            marker = next(m for m in COMPARISON_MARKERS if m != styles[other].marker)
            styles[name] = LineStyle(color, marker)
    return styles


def unhidden(style: LineStyle, values, earlier: list) -> LineStyle:
    """``style``, dashed where ``values`` equal those of a series drawn earlier in the panel
    (``earlier``), so that the earlier line shows between the dashes instead of vanishing."""
    values = np.asarray(values, dtype=float)
    same = any(
        np.shape(values) == np.shape(other) and np.allclose(values, other, equal_nan=True)
        for other in earlier
    )
    return LineStyle(style.color, style.marker, OVERLAP_DASHES) if same else style


def method_styles(labels: Iterable[str]) -> dict[str, LineStyle]:
    """The style of each label, a run label (``gr4cil``) or its row label (``GR4CIL``):
    ``METHOD_STYLES``, else the fallbacks in sorted order of the labels without a style."""
    labels = list(dict.fromkeys(labels))
    styles = {}
    for label in labels:
        name = label if label in METHOD_STYLES else _STRATEGY_BY_ROW_LABEL.get(label)
        if name in METHOD_STYLES:
            styles[label] = METHOD_STYLES[name]
    for i, label in enumerate(sorted(set(labels) - set(styles))):
        styles[label] = LineStyle(
            FALLBACK_COLORS[i % len(FALLBACK_COLORS)],
            FALLBACK_MARKERS[i % len(FALLBACK_MARKERS)],
            FALLBACK_DASHES,
        )
    return {label: styles[label] for label in labels}


def plot_series(
    ax, x, mean, low, high, label: str, style: LineStyle, highlighted: bool = False, **line_options
) -> Line2D:
    """One series of a line figure: ``mean`` as a line with markers and a band from ``low`` to
    ``high``; a ``highlighted`` series is drawn on top of the others in a heavier line."""
    # white edges set filled markers apart where lines cross; a line-art marker is all edge
    edge = "w" if MarkerStyle(style.marker).is_filled() else style.color
    emphasis = {"linewidth": HIGHLIGHT_LINEWIDTH, "zorder": HIGHLIGHT_ZORDER} if highlighted else {}
    emphasis.update(line_options)  # the caller's options win (a comparison's zorder)
    (line,) = ax.plot(
        x,
        mean,
        color=style.color,
        marker=style.marker,
        dashes=style.dashes,
        markeredgewidth=0.75,
        markeredgecolor=edge,
        label=label,
        **emphasis,
    )
    ax.fill_between(x, low, high, color=style.color, alpha=0.2)
    return line


def panel_figsize(n_panels: int) -> tuple[float, float]:
    """Size of a figure with ``n_panels`` panels in rows of at most ``MAX_COLUMNS``."""
    columns = min(n_panels, MAX_COLUMNS)
    rows = -(-n_panels // MAX_COLUMNS)
    return max(PANEL_SIZE[0] * columns, MIN_WIDTH), PANEL_SIZE[1] * rows + 1.0  # + title and legend


@contextmanager
def figure_style():
    """The look of every figure of the report (seaborn's whitegrid, paper context); draw inside it."""
    with sns.axes_style("whitegrid"), sns.plotting_context("paper", font_scale=1.1):
        yield


def save_figure(fig: Figure, out_dir: Path, name: str, caveat: str | None = None) -> list[Path]:
    """``out_dir/NAME.png`` (at ``DPI``) and ``out_dir/NAME.pdf``; returns both paths. A ``caveat``
    (``benchmarks.runner.reading.figure_caveat``) is one grey line in a strip added above the figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    if caveat:
        _add_caveat_strip(fig, caveat)
    fig.savefig(paths[0], dpi=DPI)
    fig.savefig(paths[1])
    return paths


CAVEAT_STRIP = 0.3  # inches: one line of small text


def _add_caveat_strip(fig: Figure, caveat: str) -> None:
    """Lay ``fig`` out, then grow it by a strip at its top and write ``caveat`` there: every axes and
    figure text keeps its place in inches from the bottom, so nothing the layout placed moves."""
    fig.draw_without_rendering()  # the layout engine places everything
    fig.set_layout_engine("none")  # and it stays placed
    height = fig.get_figheight()
    scale = height / (height + CAVEAT_STRIP)
    for ax in fig.axes:
        box = ax.get_position()
        ax.set_position((box.x0, box.y0 * scale, box.width, box.height * scale))
    # fig.texts holds the suptitle, supxlabel, supylabel and fig.text's: in fractions of the height
    for text in fig.texts:
        text.set_y(text.get_position()[1] * scale)
    fig.set_figheight(height + CAVEAT_STRIP)  # figure legends keep their place from the bottom edge
    middle = 1 - CAVEAT_STRIP / 2 / (height + CAVEAT_STRIP)
    fig.text(0.5, middle, caveat, ha="center", va="center", fontsize="small", color="dimgray")


def panel_grid(n: int) -> tuple[Figure, list]:
    """A figure of ``n`` panels in rows of at most ``MAX_COLUMNS``, and its ``n`` axes."""
    fig = Figure(figsize=panel_figsize(n), layout="constrained")
    columns = min(n, MAX_COLUMNS)
    axes = fig.subplots(-(-n // MAX_COLUMNS), columns, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])
