"""Strategies by name. Adding a strategy is one file in ``strategies/methods/`` with
``@register("name")``, the file named as the strategy (``gr4cil.py`` registers ``gr4cil``).

The names are the files' names, so a new file needs no edit elsewhere, a lookup imports that one
file, and an unknown name is refused without importing any (torch, open_clip and Avalanche take
seconds); the rest of ``strategies`` is the base the methods build on, never searched. A strategy
outside the package can be named as ``module.path:ClassName``, and one written for another
framework through its adapter (``strategies.frameworks``):
``avalanche:LwF`` (a strategy of ``avalanche.training``), ``avalanche:module.path:ClassName``,
``pycil:module.path:ClassName`` or ``mammoth:module.path:ClassName``. Every class is checked
against the runner's contract (``strategies.contract``) when it is looked up.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import traceback

from benchmarks.core.errors import UserError
from benchmarks.core.registry import Registry

#: name prefix -> the module whose ``adapt(cls, name)`` brings that framework's strategies in
FRAMEWORKS = {
    "avalanche": "strategies.frameworks.avalanche",
    "pycil": "strategies.frameworks.pycil",
    "mammoth": "strategies.frameworks.mammoth",
}
_ADAPTED: dict[str, type] = {}
#: every registered strategy class by name; a module failing at import is one line naming it
STRATEGIES: Registry[type] = Registry(
    "strategies.methods",
    "strategy",
    importer=lambda module: _import_module(module, "strategy", module),
)


def register(name: str):
    """Class decorator: make a ``CLIPStrategy`` subclass available under ``name``."""

    def wrap(cls):
        package, _, stem = cls.__module__.rpartition(".")
        if package == STRATEGIES.package and stem != name:
            raise ValueError(
                f"{cls.__module__} registers {name!r}: a method's name is its file's ({stem!r}), so "
                "that a lookup imports that file alone"
            )
        STRATEGIES.add(name, cls)
        cls.name = name
        return cls

    return wrap


def method_files() -> list[str]:
    """The methods' names: the modules of ``strategies/methods/`` (whose __init__ holds nothing but
    a docstring), found without importing them."""
    return STRATEGIES.module_names()


def available() -> list[str]:
    """Every strategy's name: the methods' files and anything registered from elsewhere."""
    return sorted({*method_files(), *STRATEGIES.members})


def import_class(name: str, what: str = "strategy") -> type:
    """The class ``module.path:ClassName`` names (a ``what``: strategy or plugin); each way it can fail
    is one line that says which: the module is not on the path, it has no such class, or an import
    inside it failed."""
    module_name, _, attr = name.partition(":")
    if not module_name or module_name.startswith(".") or not attr:
        raise UserError(f"{what} {name!r}: give it as module.path:ClassName")
    try:
        module = _import_module(module_name, what, name)
    except ImportError as err:
        missing = err.name if isinstance(err, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            package, _, leaf = missing.rpartition(".")
            if package:  # the package imported: the path after it is wrong
                raise UserError(
                    f"cannot import {what} {name!r}: package {package!r} has no module {leaf!r}; "
                    "check the module path before the colon"
                ) from None
            raise UserError(
                f"cannot import {what} {name!r}: no module named {missing!r} on the Python path; "
                f"install the {what}'s package with pip install -e PATH (the folder of its "
                f"pyproject.toml), or put the folder that holds {missing!r} on PYTHONPATH "
                "(e.g. PYTHONPATH=examples/my_strategy)"
            ) from None
        # The module was found: its own code failed to import something (a bug or a missing package).
        raise UserError(
            f"cannot import {what} {name!r}: module {module_name!r} was found, but an import inside "
            f"it failed ({type(err).__name__}{_raised_at(err)}: {err}); install what it needs or fix "
            "that import"
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        classes = [key for key, value in vars(module).items() if isinstance(value, type)]
        close = difflib.get_close_matches(attr, classes, n=1)
        raise UserError(
            f"cannot import {what} {name!r}: module {module_name!r} "
            f"({getattr(module, '__file__', None) or 'a namespace package'}) has no class {attr!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    return cls


def _import_module(module_name: str, what: str, name: str):
    """The module, imported; its own code failing with anything but an ImportError (a RuntimeError,
    a SyntaxError, a failed assert) is one line naming the module and the error, not a traceback."""
    try:
        return importlib.import_module(module_name)
    except (ImportError, UserError):
        raise  # the caller tells a missing module from a failed import inside it; a UserError is one line
    except Exception as err:
        if isinstance(err, SyntaxError):  # its message and place are the file's, not a frame's
            where, message = f" at {err.filename}:{err.lineno}", err.msg
        else:
            where, message = _raised_at(err), str(err)
        raise UserError(
            f"cannot import {what} {name!r}: module {module_name!r} failed while it was imported "
            f"({type(err).__name__}{where}: {message}); fix that module"
        ) from None


def _raised_at(err: BaseException) -> str:
    """`` at FILE:LINE``: the innermost frame of the failed import outside Python's import machinery."""
    frames = [
        frame
        for frame in traceback.extract_tb(err.__traceback__)
        if frame.filename != __file__ and not frame.filename.startswith("<frozen")
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def get_strategy(name: str) -> type:
    """The strategy class registered as ``name``, imported from ``module:Class``, or another
    framework's class in its adapter (``avalanche:LwF``, ``pycil:module:Class``, ...)."""
    framework, _, rest = name.partition(":")
    if framework in FRAMEWORKS:
        return _adapted(framework, rest, name)
    if ":" in name:
        from strategies.contract import check_strategy  # torch: a name's check needs none

        return check_strategy(import_class(name), name)
    check_name(name)
    if name not in STRATEGIES.members:
        STRATEGIES.importer(f"{STRATEGIES.package}.{name}")  # its file registers it
    return STRATEGIES.members[name]


def check_name(name: str) -> None:
    """A strategy's name that is neither a method's file nor registered, refused in one line without
    importing a method; a ``module:Class`` or framework name is checked where it is imported."""
    if ":" not in name and name not in STRATEGIES.members and name not in method_files():
        names = available()
        close = difflib.get_close_matches(name, names, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"unknown strategy {name!r}; {guess}available: {', '.join(names)}")


def _adapted(framework: str, rest: str, name: str) -> type:
    """The adapter class of ``framework`` around the class ``rest`` names, one per name."""
    from strategies.contract import check_strategy

    if name not in _ADAPTED:
        if framework == "avalanche" and ":" not in rest:  # a strategy Avalanche ships
            rest = f"avalanche.training:{rest}"
        if ":" not in rest:
            raise UserError(f"strategy {name!r}: give it as {framework}:module.path:ClassName")
        adapter = importlib.import_module(FRAMEWORKS[framework])
        importing = getattr(adapter, "importing", None)  # what the framework's import may not change
        with contextlib.nullcontext() if importing is None else importing(rest, name):
            cls = import_class(rest)
        _ADAPTED[name] = check_strategy(adapter.adapt(cls, name), name)
    return _ADAPTED[name]
