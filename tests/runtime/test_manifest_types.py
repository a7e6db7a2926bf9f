"""Issue 55: every manifest field is type-checked before it is used, by the one parse path (check_manifest), in the
API as in the CLI. Any field set to any JSON type: Predictor.open raises PackageError or answers; `edgekit predict`
exits 0, or 2 with one line."""

import copy
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.runtime import Predictor
from edgekit.runtime.package import PackageError

from .test_bounds import build_small
from .test_trust import copy_of

JSON_VALUES = [None, True, False, 0, -1, 1.5, 2 ** 40, "", "x", "onnx", [], [4], ["x"], {}, {"a": 1}]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("types"), tiny_bert)


def paths(value, at=()) -> list[tuple]:
    """Every field's path in a manifest: each key of each object and each item of each list, containers too."""
    out = [at] if at else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for k, v in items:
        out += paths(v, (*at, k))
    return out


def set_at(m: dict, path: tuple, value) -> dict:
    m = copy.deepcopy(m)
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return m


def cli(args: list[str]) -> tuple[int, str]:
    """The CLI's entry function in process (tests/cli/test_cli.py `run`): (exit code, what it printed)."""
    from tests.cli.test_cli import run

    r = run(*args)
    return r.returncode, r.stderr + r.stdout


def test_every_manifest_field_of_every_json_type_is_a_package_error_or_an_answer(pkg, tmp_path):
    root = copy_of(pkg, tmp_path)
    good = json.loads((root / "manifest.json").read_text())
    fields = paths(good)
    seen = {"refused": 0, "answered": 0}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(fields), st.sampled_from(JSON_VALUES), st.sampled_from(["executorch", "onnx"]))
    def case(path, value, runtime):
        (root / "manifest.json").write_text(json.dumps(set_at(good, path, value)))
        try:
            Predictor.open(root, runtime).predict("play queen")
            seen["answered"] += 1
        except PackageError as e:
            assert "\n" not in str(e), (path, value, str(e))
            seen["refused"] += 1
        code, said = cli(["predict", str(root), "play queen"])
        assert "Traceback" not in said and code in (0, 2), (path, value, code, said[-1500:])
        if code == 2:
            assert said.startswith("error:") and said.strip().count("\n") == 0, (path, value, said)

    case()
    assert seen["refused"] > 100 and seen["answered"] > 0, seen  # both ways were taken


@pytest.mark.parametrize("field,value,words", [
    ("primary_runtime", 5, "primary_runtime: 5 is not one of"),
    ("primary_runtime", None, "primary_runtime: None is not one of"),
    ("primary_runtime", ["onnx"], "primary_runtime: ['onnx'] is not one of"),
    ("schema_version", [4], "schema_version [4], this runtime reads 2, 3 and 4"),
])
def test_wrong_types_that_escaped_are_one_line_in_predict_verify_and_open(pkg, tmp_path, field, value, words):
    root = copy_of(pkg, tmp_path)
    m = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**m, field: value}))
    with pytest.raises(PackageError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Predictor.open(root)
    for args in (["predict", str(root), "play queen"], ["verify", str(root)]):
        out = subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.startswith("error:") and out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
