"""The import rule, checked over the tree with ``ast``: a module imports only from its own layer or
the layers below it (``benchmarks/__init__.py`` lists them), and no chain of imports is a circle.
Imports inside functions count as much as those at the top of a file."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("benchmarks", "strategies", "analysis")

# Layer of each part of the tree, lowest first; the longest matching prefix decides.
LAYERS = {
    "benchmarks.core": 0,
    "benchmarks.data": 1,
    "benchmarks.backbone": 2,
    "strategies": 3,
    "benchmarks.runner": 4,
    "analysis": 5,
    "benchmarks.miniature": 5,
    "benchmarks.tools": 5,
    "benchmarks.tools.walk": 6,
    "benchmarks.run": 6,
    "benchmarks.run_suite": 6,
    "benchmarks.tune": 6,
    "benchmarks.tune_study": 6,
    "benchmarks.tune_space": 6,
    "benchmarks.prepare": 6,
    "benchmarks": 0,  # the package's own __init__
}


def layer_of(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that ``path`` imports: ``from X import Y`` names module X.Y when Y is a
    module, else X."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                out.add(child if child in known else node.module)
    return {name for name in out if name.split(".")[0] in PACKAGES}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def test_every_import_goes_to_the_same_layer_or_below():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_strategies_never_import_analysis_and_benchmarks_only_for_the_results_table():
    edges = graph()
    assert not [
        m for m in edges if m.startswith("strategies") and any(t.startswith("analysis") for t in edges[m])
    ]
    analysis_users = {
        (m, t)
        for m, targets in edges.items()
        if m.startswith("benchmarks")
        for t in targets
        if t.startswith("analysis")
    }
    assert analysis_users == {("benchmarks.run_suite", "analysis.tables")}


def test_the_import_graph_has_no_circle():
    edges = graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not circles, circles


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: a core module that imports the runner is reported."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from benchmarks.runner.results import ResultStore\n")
    (target,) = imports(path, modules())
    assert target == "benchmarks.runner.results" and layer_of(target) > layer_of("benchmarks.core.bad")


def _declared_layers() -> dict[str, int]:
    """Each part that ``benchmarks/__init__.py``'s numbered list names in double backticks, with
    the number of its item (``strategies`` and ``analysis`` are top-level packages)."""
    import re

    import benchmarks

    items: dict[int, str] = {}
    layer = None
    for line in benchmarks.__doc__.splitlines():
        if item := re.match(r"(\d)\. ", line):
            layer = int(item[1])
        if layer is not None and line.strip():
            items[layer] = items.get(layer, "") + " " + line
    declared = {}
    for layer, text in items.items():
        for name in re.findall(r"``([a-z_.]+)``", re.sub(r"\([^()]*\)", "", text)):  # not the asides
            top = name.split(".")[0] in ("strategies", "analysis")
            declared[name if top else f"benchmarks.{name}"] = layer
    return declared


def test_the_package_docstring_declares_every_layer_the_check_uses():
    expected = {name: layer for name, layer in LAYERS.items() if name != "benchmarks"}
    assert _declared_layers() == expected


def test_every_part_of_the_tree_has_a_layer_and_a_row_in_the_readme():
    """Each package of ``benchmarks`` (and each top-level module) is in ``LAYERS`` by its own name or
    its parent's, and its folder or file is named in the README's parts table."""
    parts = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "benchmarks").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    )
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| part | where |") : readme.index("The table runs")]
    for part in [*parts, "strategies", "analysis"]:
        module = part.removesuffix(".py").replace("/", ".")
        assert module in LAYERS, f"{module} has no layer in LAYERS (and benchmarks/__init__.py)"
        named = f"`{part}/`" if not part.endswith(".py") else f"`{part}`"
        assert named in table, f"the README's parts table does not name {named}"


def test_the_tools_package_names_every_tool_it_holds():
    import benchmarks.tools

    tools = {p.stem for p in (ROOT / "benchmarks" / "tools").iterdir() if p.suffix == ".py" or p.is_dir()}
    tools -= {"__init__", "__pycache__"}
    assert tools and all(f"``{name}``" in benchmarks.tools.__doc__ for name in tools), tools
