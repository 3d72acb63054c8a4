"""The folder tree is the architecture: imports run one way through the layers, nothing in
``latsim`` imports the live harness, and the light entry points stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Layers bottom-up; a module may import from its own layer and the ones before it.
LAYERS = ("errors", "writing", "numeric", "formatting", "controller", "plugins", "model",
          "run", "sim", "analysis", "experiments", "viz", "cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module_level_only: bool) -> set[str]:
    return _imported(path.read_text(), _module_name(path), path.name == "__init__.py",
                     module_level_only)


def _imported(source: str, module: str, is_package: bool, module_level_only: bool
              ) -> set[str]:
    """Every module ``source`` (the module ``module``) imports: ``import``, ``from``
    (relative ones resolved against its package) and ``importlib.import_module`` or
    ``__import__`` of a literal name; with ``module_level_only``, those that run when it
    is imported (not inside a function)."""
    tree = ast.parse(source)
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            found.add(node.args[0].value)
        if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda)):
            continue  # runs when called, not when imported
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_the_import_reader_sees_relative_lazy_and_importlib_imports():
    """The three an earlier version missed, in a controller module."""
    source = (
        "from ..experiments import engine\n"
        "from . import policies\n"
        "import importlib\n"
        "def late():\n"
        "    import harness.cli\n"
        "    return importlib.import_module('latsim.cli')\n"
        "try:\n"
        "    from latsim.viz import timeline\n"
        "except ImportError:\n"
        "    pass\n")
    everywhere = _imported(source, "latsim.controller.timing", False, False)
    assert {"latsim.experiments.engine", "latsim.controller.policies", "harness.cli",
            "latsim.cli", "latsim.viz.timeline"} <= everywhere
    at_import = _imported(source, "latsim.controller.timing", False, True)
    assert "harness.cli" not in at_import and "latsim.cli" not in at_import
    assert {"latsim.experiments.engine", "latsim.viz.timeline"} <= at_import
    assert "latsim.model.costs" in _imported("from .costs import x", "latsim.model", True,
                                             True)


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "latsim" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def test_every_latsim_module_belongs_to_a_layer():
    stray = [_module_name(p) for p in _sources("latsim")
             if _module_name(p) != "latsim" and _layer(_module_name(p)) is None]
    assert not stray


@pytest.mark.parametrize("path", _sources("latsim"), ids=lambda p: _module_name(p))
def test_imports_run_down_the_layers(path):
    own = _layer(_module_name(path))
    if own is None:
        return
    upward = sorted(m for m in _imports(path, module_level_only=False)
                    if (_layer(m) or 0) > own)
    assert not upward, f"{_module_name(path)} (layer {LAYERS[own]}) imports {upward}"


def test_latsim_never_imports_the_harness():
    """Not at module level, and not lazily either: the harness reaches latsim's command
    line through its plug-in entry points."""
    offenders = [_module_name(p) for p in _sources("latsim")
                 if any(m == "harness" or m.startswith("harness.")
                        for m in _imports(p, module_level_only=False))]
    assert not offenders


@pytest.mark.parametrize("package", ["latsim", "harness"])
def test_no_import_cycles_even_through_lazy_or_type_checking_imports(package):
    modules = {_module_name(p): p for p in _sources(package)}
    # imports inside functions (and under TYPE_CHECKING) count: a lazy import still makes
    # a cycle of layers
    graph = {
        name: {m for m in _imports(path, module_level_only=False) if m in modules and m != name}
        for name, path in modules.items()
    }
    # a package's __init__ re-exporting its own submodules is not a cycle of layers
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [])


#: What the controller never imports: it is pure logic, so no files, no clock, no simulator
#: or accelerator. The run layer reads and writes its records (:mod:`latsim.run.record_files`).
CONTROLLER_NEVER_IMPORTS = ("csv", "io", "os", "pathlib", "shutil", "stat", "tempfile",
                            "socket", "time", "simpy", "numpy", "torch", "latsim.writing")
#: Calls that open or read or write a file, by the name called.
FILE_CALLS = ("open", "read_text", "write_text", "read_bytes", "write_bytes")


def _controller_io(source: str, module: str, is_package: bool) -> list[str]:
    """What in ``source`` does I/O: the modules of :data:`CONTROLLER_NEVER_IMPORTS` it
    imports (lazily too), and its calls of :data:`FILE_CALLS`."""
    found = sorted(m for m in _imported(source, module, is_package, module_level_only=False)
                   if any(m == name or m.startswith(name + ".")
                          for name in CONTROLLER_NEVER_IMPORTS))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = (node.func.id if isinstance(node.func, ast.Name) else
                      node.func.attr if isinstance(node.func, ast.Attribute) else None)
            if called in FILE_CALLS:
                found.append(f"{called}() on line {node.lineno}")
    return found


def test_the_io_reader_sees_imports_and_file_calls():
    source = ("import csv\n"
              "from latsim.writing import writing\n"
              "def save(path):\n"
              "    from pathlib import Path\n"
              "    with open(path) as f, Path(path).open() as g:\n"
              "        return Path(path).read_text()\n")
    found = _controller_io(source, "latsim.controller.records", False)
    assert {"csv", "latsim.writing", "pathlib", "open() on line 5",
            "read_text() on line 6"} <= set(found)
    assert not _controller_io("import math\nfrom dataclasses import fields\n",
                              "latsim.controller.records", False)


@pytest.mark.parametrize("path", _sources("latsim/controller"), ids=lambda p: _module_name(p))
def test_the_controller_does_no_io(path):
    found = _controller_io(path.read_text(), _module_name(path), path.name == "__init__.py")
    assert not found, f"{_module_name(path)} does I/O: {found}"


def _loaded_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return {name.split(".")[0] for name in out.split()}


@pytest.mark.parametrize(("module", "absent"), [
    ("latsim.controller", {"simpy", "numpy", "torch"}),
    ("latsim.cli.root", {"numpy", "simpy", "pandas", "matplotlib", "torch", "harness"}),
    ("harness.live.driver", {"simpy", "torch", "matplotlib"}),
])
def test_light_entry_points_stay_light(module, absent):
    assert not (_loaded_after_import(module) & absent)


#: The harness's parts and their rank: a part may import its own modules and those of
#: lower ranks, never a sibling's (measure and serve share live, not each other).
HARNESS_PARTS = {"generators": 0, "telemetry": 0, "net": 0, "live": 1, "measure": 2,
                 "serve": 2, "viewer": 3, "tools": 3, "cli": 4}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def test_every_harness_module_belongs_to_a_part():
    stray = [_module_name(p) for p in _sources("harness")
             if _module_name(p) != "harness" and _part(_module_name(p)) not in HARNESS_PARTS]
    assert not stray


@pytest.mark.parametrize("path", _sources("harness"), ids=lambda p: _module_name(p))
def test_harness_imports_run_generators_then_live_then_measure_and_serve(path):
    own = _part(_module_name(path))
    if own not in HARNESS_PARTS:
        return
    wrong = sorted(m for m in _imports(path, module_level_only=False)
                   if (part := _part(m)) in HARNESS_PARTS and part != own
                   and HARNESS_PARTS[part] >= HARNESS_PARTS[own])
    assert not wrong, f"{_module_name(path)} ({own}) imports {wrong}"
