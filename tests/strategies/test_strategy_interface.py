"""The public strategy interface matches its documentation (docs/adding-a-strategy.md): the hook,
attribute, helper and Avalanche-method tables hold every public name of ``CLIPStrategy`` (its
mixins' included) exactly once, with the hooks' signatures as written; the ``StrategyConfig`` table
lists every field with its default; the Avalanche example runs as written; no doc or example calls
a private name."""

import dataclasses
import inspect
import re
import warnings
from pathlib import Path

from strategies.base import CLIPStrategy
from strategies.config import StrategyConfig

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "adding-a-strategy.md").read_text()
TABLES = {
    "hooks": "### Hooks",
    "attributes": "### Class attributes",
    "helpers": "### Helpers",
    "avalanche": "### Avalanche's methods the base implements",
}


def _section(heading: str) -> str:
    start = DOC.index(heading + "\n")
    following = re.search(r"^#{2,3} ", DOC[start + len(heading) :], re.M)
    return DOC[start : start + len(heading) + (following.start() if following else len(DOC))]


def _first_cells(heading: str) -> list[str]:
    rows = [line for line in _section(heading).splitlines() if line.startswith("| `")]
    return [row.split("|")[1] for row in rows]


def _documented(heading: str) -> dict[str, str]:
    """name -> its arguments as written (``setup_task(task, classes)`` -> ``(task, classes)``), from a
    table's first column."""
    return {
        match.group(1): match.group(2) or ""
        for cell in _first_cells(heading)
        for match in re.finditer(r"`(\w+)(\([^`]*\))?`", cell)
    }


def test_every_public_name_of_the_base_is_in_exactly_one_table():
    tables = {kind: set(_documented(heading)) for kind, heading in TABLES.items()}
    own = [cls for cls in CLIPStrategy.__mro__ if cls.__module__.startswith("strategies.")]  # and its mixins
    public = {name for cls in own for name in vars(cls) if not name.startswith("_")}
    listed = [name for names in tables.values() for name in names]
    assert sorted(set(listed)) == sorted(public)
    assert len(listed) == len(set(listed)), "a name is in two tables"


def test_the_documented_hooks_have_the_documented_signatures():
    for name, arguments in _documented(TABLES["hooks"]).items():
        written = [p.strip().split("=")[0] for p in arguments.strip("()").split(",") if p.strip()]
        actual = [p for p in inspect.signature(getattr(CLIPStrategy, name)).parameters if p != "self"]
        assert written == actual, f"{name}: the docs say {written}, the class takes {actual}"


def test_the_config_table_lists_every_field_with_its_default():
    rows = [line.split("|")[1:3] for line in _section("## Options").splitlines() if line.startswith("| `")]
    documented = {name.strip(" `"): default.strip() for name, default in rows}
    fields = {f.name: f.default for f in dataclasses.fields(StrategyConfig)}
    assert list(documented) == list(fields)
    for name, default in fields.items():
        written = documented[name]
        assert written == (f'"{default}"' if isinstance(default, str) else repr(default)), name


# A PyCIL-shaped learner's public names by that framework's convention (strategies/frameworks/pycil.py)
PYCIL_CONVENTIONS = {
    "self._network",
    "self._cur_task",
    "self._known_classes",
    "self._total_classes",
    "self._device",
}


def test_no_doc_or_example_calls_a_private_name_of_a_strategy():
    texts = [*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("examples/**/*.py")]
    for path in texts:
        calls = set(re.findall(r"\b(?:self|strategy)\._(?!_)\w+", path.read_text()))
        if path.is_relative_to(REPO / "examples" / "pycil_ncm"):
            calls -= PYCIL_CONVENTIONS
        assert not calls, f"{path.relative_to(REPO)} uses {sorted(calls)}"


def test_the_avalanche_example_runs_as_written(monkeypatch):
    (code,) = re.findall(r"```python\n(.*?)```", _section("## Every strategy is an Avalanche strategy"), re.S)
    monkeypatch.syspath_prepend(str(REPO / "examples" / "my_strategy"))
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "docs/adding-a-strategy.md", "exec"), namespace)
    metrics = namespace["metrics"]
    stream_accuracy = [
        v for k, v in metrics.items() if k.startswith("Top1_Acc_Stream/eval_phase/test_stream")
    ]
    assert len(stream_accuracy) == 1 and 0.0 <= stream_accuracy[0] <= 1.0
    assert len(namespace["strategy"].seen_classes) == 20
