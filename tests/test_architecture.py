"""The layout's rules, checked on the source: which way imports point, what a scoring tool loads, sizes."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.engine import registry

REPO = Path(__file__).resolve().parents[1]
SOURCE = [REPO / "edgekit", REPO / "converters", REPO / "runtime"]
STAGES = REPO / "edgekit" / "engine" / "stages"


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included), as dotted names."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def test_every_stage_has_a_spec_and_a_module():
    modules = {p.stem for p in STAGES.glob("*.py")} - {"__init__", "common"}
    assert modules == set(registry.ORDER)
    for name in registry.ORDER:
        assert callable(registry.load(name).run), name


@pytest.mark.parametrize("name", registry.ORDER)
def test_a_stage_imports_no_other_stage_nor_the_runner(name):
    others = {f"edgekit.engine.stages.{n}" for n in registry.ORDER if n != name} | {"edgekit.engine.runner"}
    bad = imported(STAGES / f"{name}.py") & others
    assert not bad, f"stage {name} imports {sorted(bad)}"


def test_stage_helpers_import_no_stage():
    stages = {f"edgekit.engine.stages.{n}" for n in registry.ORDER} | {"edgekit.engine.runner"}
    assert not imported(STAGES / "common.py") & stages


def test_registry_is_a_leaf():
    assert not {m for m in imported(REPO / "edgekit" / "engine" / "registry.py") if m.startswith("edgekit")}


@pytest.mark.parametrize("path", sorted((REPO / "runtime").glob("*.py")), ids=lambda p: p.name)
def test_runtime_imports_only_itself(path):
    """The runtime stands for the phone: nothing of edgekit's outside edgekit.runtime."""
    bad = {m for m in imported(path) if m.split(".")[0] == "edgekit" and not m.startswith("edgekit.runtime")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def module_of(path: Path) -> str:
    """The dotted name a source file is imported as (runtime/ is edgekit.runtime, converters/ edgekit.converters)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts = ["edgekit", *parts] if parts[0] in ("runtime", "converters") else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other():
    """Dependencies point one way: no pair of modules imports each other, even inside a function (a package's
    __init__ re-exporting its own modules aside)."""
    files = {module_of(p): p for root in SOURCE for p in root.rglob("*.py")}
    uses = {m: {i for i in imported(p) if i in files and i != m} for m, p in files.items()}
    pairs = {tuple(sorted((a, b))) for a in uses for b in uses[a] if a in uses[b]}
    assert not {(a, b) for a, b in pairs if not b.startswith(a + ".")}, sorted(pairs)


NO_TORCH = ["edgekit.scoring.metrics", "edgekit.scoring.score", "edgekit.scoring.confidence", "edgekit.scoring.labels",
            "edgekit.data.check", "edgekit.data.oof", "edgekit.modeling.base_models", "edgekit.engine.search",
            "edgekit.reporting.frontier", "edgekit.converters.onnx_weights",
            "edgekit.tools.package_eval", "edgekit.tools.compare", "edgekit.engine.registry", "edgekit.engine.cache",
            "edgekit.cli"]


@pytest.mark.parametrize("module", NO_TORCH)
def test_importing_loads_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"importing {module} loads torch"


def test_scoring_modules_are_all_checked():
    found = {f"edgekit.scoring.{p.stem}" for p in (REPO / "edgekit" / "scoring").glob("*.py") if p.stem != "__init__"}
    assert found <= set(NO_TORCH)


def _python_files():
    return sorted(p for root in SOURCE for p in root.rglob("*.py"))


def test_no_module_over_400_lines():
    long = {p.relative_to(REPO).as_posix(): n for p in _python_files()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long


def test_no_function_over_80_lines():
    long = {}
    for p in _python_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > 80:
                    long[f"{p.relative_to(REPO).as_posix()}:{node.name}"] = node.end_lineno - first + 1
    assert not long
