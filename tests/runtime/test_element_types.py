"""Schema 3's graphs take and give only element types every phone and web binding creates (int64, int32,
float32: docs/package-format.md, "Element types"). The package stage checks each graph it ships and records what it
found (report: package.element_types); here, a small android-layout package on both runtimes. Every build in the
suite runs the same check: android (tests/engine/test_pipeline.py), web (tests/serve/test_web.py), server-cpu
(tests/serve/test_serve.py), server-gpu (tests/converters/test_optimize_onnx.py), ios below."""

import json

import pytest

from edgekit.runtime import Package
from edgekit.runtime.interface import ELEMENT_TYPES, check_element_types
from edgekit.runtime.package import MODEL_FILES
from tests.runtime.test_bounds import build_small

# what each input and output is, by name, in both files (docs/package-format.md, Inputs and Outputs)
WANT = {"inputs": ["int64", "int64", "int64", "int32", "int32"], "outputs": ["int64", "float32", "int64"]}


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
    assert [i["dtype"] for i in m["inputs"]] == WANT["inputs"] and m["schema_version"] == 3
