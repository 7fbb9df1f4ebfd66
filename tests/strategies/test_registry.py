"""``strategies.registry``: strategies by name, found without an edit elsewhere, and a
``module.path:ClassName`` from outside whose every way of failing is one line that says why."""

import subprocess
import sys
import typing

import pytest

import strategies.methods
from benchmarks.core.errors import UserError
from strategies import registry
from strategies.base import CLIPStrategy
from strategies.config import StrategyConfig
from strategies.registry import available, get_strategy, register

PAPER_STRATEGIES = {
    "adaptervlm",
    "coda_prompt",
    "continual_clip",
    "dualprompt",
    "finetune",
    "gr4cil",
    "l2p_pp",
    "magmax",
    "mg_clip",
    "moe4cl",
}


@pytest.fixture
def fresh_registry(monkeypatch):
    """A copy of the registry that the test may change; the real one is back after it."""
    monkeypatch.setattr(registry.STRATEGIES, "members", dict(registry.STRATEGIES.members))
    return registry.STRATEGIES.members


def test_registry_finds_strategies_and_reports_unknown_names():
    assert {"continual_clip", "finetune"} <= set(available())
    assert issubclass(get_strategy("finetune"), CLIPStrategy)
    assert get_strategy("strategies.methods.finetune:Finetune") is get_strategy("finetune")
    with pytest.raises(UserError, match="available"):
        get_strategy("nope")
    with pytest.raises(UserError, match="module.path:ClassName"):
        get_strategy("no_module_given:")


def test_every_registered_strategy_is_named_as_registered_and_listed_in_order():
    names = available()
    assert names == sorted(names) and PAPER_STRATEGIES <= set(names)
    for name in names:
        cls = get_strategy(name)
        assert cls.name == name and issubclass(cls, CLIPStrategy)
        assert cls.__module__.startswith("strategies.")  # found by importing the package's modules


def test_an_unknown_name_lists_every_available_strategy():
    with pytest.raises(UserError) as error:
        get_strategy("gr4cl")
    assert str(error.value) == (
        f"unknown strategy 'gr4cl'; did you mean 'gr4cil'? available: {', '.join(available())}"
    )
    with pytest.raises(UserError) as error:
        get_strategy("zzz")  # nothing close: no guess
    assert str(error.value) == f"unknown strategy 'zzz'; available: {', '.join(available())}"


def test_register_names_the_class_and_refuses_a_second_class_under_one_name(fresh_registry):
    class First(CLIPStrategy):
        pass

    class Second(CLIPStrategy):
        pass

    assert register("registry_test")(First) is First and First.name == "registry_test"
    assert register("registry_test")(First) is First  # the same class again: a re-import, allowed
    with pytest.raises(ValueError, match="strategy name 'registry_test' is registered twice"):
        register("registry_test")(Second)
    assert get_strategy("registry_test") is First and "registry_test" in available()


def _method_file(folder, monkeypatch, file: str, name: str, cls: str) -> None:
    """``folder/file.py``, a method registering class ``cls`` as ``name``, in the methods' folder."""
    (folder / f"{file}.py").write_text(
        "from strategies.base import CLIPStrategy\n"
        "from strategies.registry import register\n\n\n"
        f'@register("{name}")\n'
        f"class {cls}(CLIPStrategy):\n"
        "    pass\n"
    )
    methods = strategies.methods
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(folder)])


def test_a_new_file_in_the_methods_folder_is_found_with_no_edit_elsewhere(
    tmp_path, monkeypatch, fresh_registry
):
    _method_file(tmp_path, monkeypatch, "registry_probe", "registry_probe", "RegistryProbe")
    monkeypatch.setattr(registry.STRATEGIES, "discovered", False)
    try:
        assert get_strategy("registry_probe").__name__ == "RegistryProbe"
        assert "registry_probe" in available()
    finally:
        sys.modules.pop("strategies.methods.registry_probe", None)


@pytest.mark.parametrize("name", [":Finetune", ".finetune:Finetune", "strategies.methods.finetune:"])
def test_a_label_without_module_or_class_says_how_to_write_it(name):
    with pytest.raises(UserError) as error:
        get_strategy(name)
    assert str(error.value) == f"strategy {name!r}: give it as module.path:ClassName"


def _import_error(name: str) -> str:
    with pytest.raises(UserError) as error:
        get_strategy(name)
    return str(error.value)


def test_a_module_class_strategy_that_cannot_be_imported_says_why(tmp_path, monkeypatch):
    (tmp_path / "outside_strategy.py").write_text(
        "from strategies.base import CLIPStrategy\n\n\nclass OutsideStrategy(CLIPStrategy):\n    pass\n"
    )
    (tmp_path / "broken_strategy.py").write_text("import os\nimport no_such_package_of_theirs\n")
    (tmp_path / "bad_name_strategy.py").write_text("from os import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the module is on no path: how to put it there
    assert _import_error("not_installed_pkg.strategy:Thing") == (
        "cannot import strategy 'not_installed_pkg.strategy:Thing': no module named 'not_installed_pkg' "
        "on the Python path; install the strategy's package with pip install -e PATH (the folder of its "
        "pyproject.toml), or put the folder that holds 'not_installed_pkg' on PYTHONPATH "
        "(e.g. PYTHONPATH=examples/my_strategy)"
    )
    assert _import_error("strategies.no_such_file:Thing") == (
        "cannot import strategy 'strategies.no_such_file:Thing': package 'strategies' has no module "
        "'no_such_file'; check the module path before the colon"
    )
    # the module is there, the class is not
    assert _import_error("outside_strategy:OutsideStrategyy") == (
        f"cannot import strategy 'outside_strategy:OutsideStrategyy': module 'outside_strategy' "
        f"({tmp_path / 'outside_strategy.py'}) has no class 'OutsideStrategyy'; "
        "did you mean 'OutsideStrategy'?"
    )
    assert get_strategy("outside_strategy:OutsideStrategy").__name__ == "OutsideStrategy"
    # the module is there and fails to import something itself: a bug in it, named, not "missing"
    assert _import_error("broken_strategy:Thing") == (
        "cannot import strategy 'broken_strategy:Thing': module 'broken_strategy' was found, but an import "
        f"inside it failed (ModuleNotFoundError at {tmp_path / 'broken_strategy.py'}:2: No module named "
        "'no_such_package_of_theirs'); install what it needs or fix that import"
    )
    assert _import_error("bad_name_strategy:Thing").startswith(
        "cannot import strategy 'bad_name_strategy:Thing': module 'bad_name_strategy' was found, but an "
        f"import inside it failed (ImportError at {tmp_path / 'bad_name_strategy.py'}:1: cannot import "
        "name 'no_such_name' from 'os'"
    )


def test_a_missing_class_with_no_close_name_and_a_namespace_package_are_named_plainly(tmp_path, monkeypatch):
    (tmp_path / "plain_strategy.py").write_text("class Alpha:\n    pass\n")
    (tmp_path / "folder_without_init").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert _import_error("plain_strategy:Zebra") == (
            f"cannot import strategy 'plain_strategy:Zebra': module 'plain_strategy' "
            f"({tmp_path / 'plain_strategy.py'}) has no class 'Zebra'"
        )
        assert _import_error("folder_without_init:Thing") == (
            "cannot import strategy 'folder_without_init:Thing': module 'folder_without_init' "
            "(a namespace package) has no class 'Thing'"
        )
    finally:
        for name in ("plain_strategy", "folder_without_init"):
            sys.modules.pop(name, None)


def test_every_module_of_the_methods_folder_registers_a_strategy_and_no_other_module_does():
    import importlib
    import pkgutil

    import strategies.methods
    from strategies.registry import STRATEGIES

    registered = dict(STRATEGIES.all())  # discovery imports every module of strategies/methods/
    methods = {m.name for m in pkgutil.iter_modules(strategies.methods.__path__)}
    assert {cls.__module__ for cls in registered.values()} == {f"strategies.methods.{m}" for m in methods}
    for module in pkgutil.walk_packages(strategies.__path__, "strategies."):
        importlib.import_module(module.name)  # the base, adapters included: registers nothing
    assert STRATEGIES.all() == registered


@pytest.mark.parametrize(
    "source, says",
    [
        ('raise RuntimeError("no GPU driver here")\n', "(RuntimeError at {file}:1: no GPU driver here)"),
        ("def broken(:\n    pass\n", "(SyntaxError at {file}:1: invalid syntax)"),
        ("assert False, 'set MY_VAR first'\n", "(AssertionError at {file}:1: set MY_VAR first)"),
    ],
)
def test_a_strategy_module_that_fails_at_import_is_one_line_naming_module_and_error(
    tmp_path, monkeypatch, source, says
):
    """Anything but an ImportError raised by a strategy module's own code: the module and the error
    in one line, not a traceback."""
    name = f"failing_strategy_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        message = _import_error(f"{name}:Thing")
    finally:
        sys.modules.pop(name, None)
    assert message == (
        f"cannot import strategy '{name}:Thing': module '{name}' failed while it was imported "
        + says.format(file=tmp_path / f"{name}.py")
        + "; fix that module"
    )
    assert "\n" not in message


def _type_argument(cls: type) -> type | None:
    """The config class ``cls`` gives its base (``CLIPStrategy[GR4CILConfig]``), or None."""
    for base in getattr(cls, "__orig_bases__", ()):
        if typing.get_origin(base) is not None and issubclass(typing.get_origin(base), CLIPStrategy):
            return typing.get_args(base)[0]
    return None


def test_every_method_types_its_config_as_the_config_it_declares():
    """``self.cfg``'s type (what mypy checks a method's reads against) is the class the runner fills
    from the suite (``Config``); a method that declares one and types the other is caught here."""
    methods = [get_strategy(name) for name in sorted(available())]
    methods = [m for m in methods if issubclass(m, CLIPStrategy)]
    assert len(methods) >= len(PAPER_STRATEGIES)
    for method in methods:
        assert _type_argument(method) is method.Config, method.__name__

    class Mismatched(CLIPStrategy[StrategyConfig]):  # the check can fail
        Config = type(get_strategy("gr4cil").Config())

    assert _type_argument(Mismatched) is not Mismatched.Config


def test_a_method_file_registers_its_own_name_and_a_lookup_imports_that_file_alone(tmp_path, monkeypatch):
    _method_file(tmp_path, monkeypatch, "registry_misnamed", "another_name", "Misnamed")
    try:
        message = _import_error("registry_misnamed")
    finally:
        sys.modules.pop("strategies.methods.registry_misnamed", None)
    assert (
        "strategies.methods.registry_misnamed registers 'another_name': a method's name is its file's"
        in message
    )
    # in a fresh process: one lookup imports one method's file, and a misspelt name none
    probe = (
        "import sys\n"
        "from strategies.registry import get_strategy\n"
        "get_strategy('finetune')\n"
        "print(sorted(m for m in sys.modules if m.startswith('strategies.methods.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["['strategies.methods.finetune']"], done.stderr
