"""A schema 2 package, built by the previous release (edgekit 0.3.1, bool masks) and kept in tests/fixtures/schema2
with the answers that release gave: this runtime still loads it and answers identically, on both runtimes; its bool
graphs are outside the element-type table that schema 3 ships (edgekit.runtime.interface)."""

import json
from pathlib import Path

import pytest

from edgekit.runtime import Package, Predictor
from edgekit.runtime.interface import check_element_types, graph_types
from edgekit.runtime.package import PackageError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "schema2"
RECORDED = json.loads((FIXTURE.parent / "schema2_answers.json").read_text())


def test_a_schema_2_package_loads_as_schema_2():
    pkg = Package.load(FIXTURE)
    assert pkg.manifest["schema_version"] == 2 and pkg.mask_dtype == "bool"
    assert [i["dtype"] for i in pkg.manifest["inputs"]][3:] == ["bool", "bool"]


def same_answers(got: list[dict], want: list[dict]) -> bool:
    """Equal answers: every field exactly, the confidence to 1e-5 (XNNPACK's AVX-512 and AVX2 kernels round
    the same FP32 softmax differently in the last bits: 0.2414110 against 0.2414110 + 3e-8)."""
    strip = lambda answers: [{k: v for k, v in a.items() if k != "confidence"} for a in answers]  # noqa: E731
    return strip(got) == strip(want) and all(
        abs(a["confidence"] - b["confidence"]) <= 1e-5 for a, b in zip(got, want))


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_a_schema_2_package_answers_as_the_release_that_built_it(runtime):
    texts, want = RECORDED["texts"], RECORDED["answers"][runtime]
    intents = Package.load(FIXTURE).labels["intents"]
    p = Predictor.open(FIXTURE, runtime=runtime)
    assert same_answers([p.predict(t) for t in texts], want["default"])
    assert same_answers([p.predict(t, reject=False) for t in texts], want["no_reject"])
    assert same_answers([p.predict(t, allow_intents=intents[:2]) for t in texts], want["allow"])
    assert same_answers(p.predict_batch(texts[:8]), want["batch"])


@pytest.mark.parametrize("file", ["model.pte", "model.onnx"])
def test_schema_2_graphs_take_bool_masks_which_schema_3_refuses(file):
    types = graph_types(FIXTURE / file)
    assert all(sides["inputs"][3:] == ["bool", "bool"] for sides in types.values()), types
    with pytest.raises(PackageError, match="input 3 is bool"):
        check_element_types(FIXTURE / file)
