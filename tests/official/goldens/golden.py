"""What a golden fixture is, how it is written and read, and how official code is imported.

A fixture is one safetensors file per component, ``tests/official/fixtures/<component>.safetensors``:
the tensors under names that say their role (``input.*``, ``param.*``, ``output.*``, ``grad.*``,
``state.*``) and, in the file's metadata under ``"golden"``, a JSON record: the official
repository, commit, file and function, how the module was loaded (what was stubbed), the input
seed, the sizes and notes. Tensors are stored in float32 or int64, as the official code computed
them; a golden computed in float64 keeps its outputs in float64 (``Golden.float64``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchmarks.core.errors import UserError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROLES = ("input", "param", "output", "grad", "state")


@dataclasses.dataclass(frozen=True)
class Official:
    """One official repository at a pinned commit; ``folder`` is its checkout under --official-root."""

    repository: str  # owner/name on GitHub
    commit: str  # 40 hex digits
    folder: str

    def checkout(self, root: Path) -> Path:
        path = root / self.folder
        clone = (
            f"git clone https://github.com/{self.repository} {path} && git -C {path} checkout {self.commit}"
        )
        if not path.is_dir():
            raise UserError(f"{path} is missing: {clone}")
        head = _git_head(path)
        if head is not None and head != self.commit:
            raise UserError(f"{path} is at {head[:12]}, not the pinned {self.commit[:12]}: {clone}")
        return path


@dataclasses.dataclass
class Golden:
    """The official outputs of one component on seeded inputs."""

    component: str
    official: Official
    file: str  # path inside the repository
    function: str  # the class or function run
    loading: str  # how the module was imported: what was stubbed, and why
    seed: int
    sizes: dict[str, int]
    tensors: dict[str, torch.Tensor]
    notes: str = ""
    # name prefixes of tensors stored in float64 (a loop computed in float64, compared to 1e-12)
    float64: tuple[str, ...] = ()

    def metadata(self) -> dict:
        return {
            "component": self.component,
            "repository": self.official.repository,
            "commit": self.official.commit,
            "file": self.file,
            "function": self.function,
            "loading": self.loading,
            "seed": self.seed,
            "sizes": self.sizes,
            "notes": self.notes,
        }


def save_golden(golden: Golden, folder: Path = FIXTURES) -> Path:
    bad = [name for name in golden.tensors if name.split(".", 1)[0] not in ROLES]
    if bad:
        raise ValueError(f"tensor names must start with one of {ROLES}: {bad}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{golden.component}.safetensors"
    tensors = {name: _stored(t, name.startswith(golden.float64)) for name, t in golden.tensors.items()}
    partial = path.with_suffix(".partial")
    save_file(tensors, str(partial), metadata={"golden": json.dumps(golden.metadata(), sort_keys=True)})
    partial.replace(path)  # written beside, renamed into place: never a half-written fixture
    return path


def load_golden(component: str, folder: Path = FIXTURES) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the metadata record of one fixture."""
    path = folder / f"{component}.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        meta = json.loads(handle.metadata()["golden"])
    return load_file(str(path)), meta


def fixture_components(folder: Path = FIXTURES) -> set[str]:
    return {path.stem for path in folder.glob("*.safetensors")}


def _stored(tensor: torch.Tensor, float64: bool = False) -> torch.Tensor:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bool:
        tensor = tensor.to(torch.int64)
    elif tensor.is_floating_point():
        tensor = tensor.to(torch.float64 if float64 else torch.float32)
    elif tensor.dtype != torch.int64:
        tensor = tensor.to(torch.int64)
    return tensor.contiguous()


def _git_head(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def stub_module(name: str, **attributes) -> types.ModuleType:
    """A stand-in for a module the official file imports but the component never uses."""
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    module.__golden_stub__ = True
    return module


@contextlib.contextmanager
def official_import_path(
    checkout: Path, stubs: dict[str, types.ModuleType] | None = None
) -> Iterator[Callable[[str, str], types.ModuleType]]:
    """Import official files from ``checkout``, with ``stubs`` standing in for modules in
    ``sys.modules`` meanwhile. Yields ``load(relative_path, module_name)``. Everything is undone
    afterwards: the suite's own modules never see the official ones."""
    stubs = stubs or {}
    saved_modules = dict(sys.modules)
    saved_path = list(sys.path)
    sys.path.insert(0, str(checkout))
    sys.modules.update(stubs)

    def load(relative: str, name: str) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(name, checkout / relative)
        if spec is None or spec.loader is None:
            raise UserError(f"cannot import {checkout / relative}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    try:
        yield load
    finally:
        sys.path[:] = saved_path
        for name in list(sys.modules):
            if name not in saved_modules:
                del sys.modules[name]
        sys.modules.update(saved_modules)


def looks_trained(module: torch.nn.Module, generator: torch.Generator, scale: float = 0.05) -> None:
    """Give every floating parameter of ``module`` a seeded random value of ``scale``'s size added
    to its own, so that zero-initialised ones (up-projections, routers, LoRA B) exercise their terms."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.is_floating_point():
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator).to(parameter))
