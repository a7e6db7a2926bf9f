"""Schema 3's and 4's graphs take and give only element types every phone and web binding creates (int64, int32,
float32: docs/package-format.md, "Element types"). The package stage checks each graph it ships and records what it
found (report: package.element_types); here, a small ios package (tests/runtime/test_bounds.py build_small) on both
runtimes, read back from its files. Every build in the suite runs the same check, and these builds record it:
android (tests/engine/test_pipeline.py), web (tests/serve/test_web.py), server-cpu (tests/serve/test_serve.py),
server-gpu (tests/converters/test_optimize_onnx.py)."""

import json

import pytest

from edgekit.runtime import Package
from edgekit.runtime.interface import ELEMENT_TYPES, check_element_types
from edgekit.runtime.package import MODEL_FILES
from tests.runtime.test_bounds import build_small

# what each input and output is, by name, in both files (docs/package-format.md, Inputs and Outputs)
WANT = {"inputs": ["int64", "int64", "int64", "int32", "int32"], "outputs": ["int64", "float32", "int64", "float32"]}


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("types"), tiny_bert)


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_every_input_and_output_has_a_type_from_the_table(pkg, runtime):
    types = check_element_types(pkg / MODEL_FILES[runtime])
    for graph, sides in types.items():
        assert sides == WANT, (graph, sides)
        assert set(sides["inputs"] + sides["outputs"]) <= set(ELEMENT_TYPES)
    report = json.loads((pkg / "report.json").read_text())
    package = next(p for p in report["passes"] if p["name"] == "package")["extra"]["package"]
    assert package["element_types"][runtime] == types  # recorded by the build
    m = Package.load(pkg).manifest
    assert [i["dtype"] for i in m["inputs"]] == WANT["inputs"] and m["schema_version"] == 4
    assert m["profile"] == "ios"


def assert_table_types(pkg_dir) -> None:
    """The package's graphs, as its build recorded them and as its files declare them, use the table's types in
    the order WANT gives (phone and server packages alike). The android, web, server-cpu and server-gpu tests
    call this on their builds."""
    report = json.loads((pkg_dir / "report.json").read_text())
    recorded = next(p for p in report["passes"] if p["name"] == "package")["extra"]["package"]["element_types"]
    for runtime, graphs in recorded.items():
        assert graphs == check_element_types(pkg_dir / MODEL_FILES[runtime]), runtime
        n = len(Package.load(pkg_dir).manifest["outputs"])
        assert all(sides == {"inputs": WANT["inputs"], "outputs": WANT["outputs"][:n]} for sides in graphs.values())
