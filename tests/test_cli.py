"""The command line as a user meets it: one-line errors with exit code 2, JSON answers."""

import subprocess
import sys

import pytest

from .conftest import DEMO


def run(*args):
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True, timeout=300)


def assert_one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_target(tmp_path):
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path), "--target", "toaster"),
                          "unknown --target 'toaster'", "android")


def test_missing_package_dir(tmp_path):
    assert_one_line_error(run("predict", str(tmp_path / "nope"), "hi"), "no such package directory")


def test_bad_data_names_file_and_line(tmp_path):
    d = tmp_path / "data" / "train"
    d.mkdir(parents=True)
    (d / "seq.in").write_text("a b\nc d e\n")
    (d / "seq.out").write_text("O O\nO O\n")
    (d / "label").write_text("x\ny\n")
    assert_one_line_error(run("build", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "o")),
                          "seq.out:2:", "2 tags")
    (d / "label").unlink()
    assert_one_line_error(run("build", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "o")),
                          "label: missing split file")


@pytest.mark.parametrize("content,needle", [("", "empty"), ("just some words\n", "unknown format")])
def test_empty_or_unknown_file(tmp_path, content, needle):
    f = tmp_path / "data.txt"
    f.write_text(content)
    assert_one_line_error(run("build", "--data", str(f), "--out", str(tmp_path / "o")), str(f), needle)


def test_nothing_written_on_bad_input(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.json").write_text('{"kept": true}')
    res = run("build", "--data", str(tmp_path / "missing.csv"), "--out", str(out))
    assert res.returncode == 2
    assert (out / "report.json").read_text() == '{"kept": true}'


def test_predict_json_on_built_package(tmp_path, tiny_bert):
    import json

    out = tmp_path / "pkg"
    res = run("build", "--data", str(DEMO), "--out", str(out), "--base-model", str(tiny_bert), "--epochs", "1",
              "--steps-limit", "3", "--stages", "teacher,export,package")
    assert res.returncode == 0, res.stderr[-2000:]
    for rt in ("executorch", "onnx"):
        for text in ["set an alarm for 7 am", "", "😀 ¿qué?"]:
            r = run("predict", str(out), text, "--runtime", rt)
            assert r.returncode == 0, r.stderr[-2000:]
            ans = json.loads(r.stdout)
            assert set(ans) >= {"intent", "confidence", "slots"}
    long = run("predict", str(out), "alarm " * 300)
    assert long.returncode == 0 and "truncated" in long.stderr
    assert_one_line_error(run("predict", str(out), "hi", "--runtime", "tflite"), "unknown --runtime")
    allowed = json.loads((out / "labels.json").read_text())["intents"][:2]
    for rt in ("executorch", "onnx"):
        r = run("predict", str(out), "set an alarm for 7 am", "--runtime", rt, "--allow-intents", ",".join(allowed),
                "--no-reject")
        assert r.returncode == 0 and json.loads(r.stdout)["intent"] in allowed, r.stderr[-2000:]
    assert_one_line_error(run("predict", str(out), "hi", "--allow-intents", "dance"), "unknown intent 'dance'")
    # bench: the package against its FP32 teacher exported the same way, in one run
    b = run("bench", str(out), "--data", str(DEMO), "--n", "20", "--compare-teacher")
    assert b.returncode == 0, b.stderr[-2000:]
    rep = json.loads(b.stdout)
    assert rep["package_latency"]["n"] == 60 and rep["teacher_latency"]["p50_ms"] > 0
    assert rep["speedup_p50"] == pytest.approx(rep["teacher_latency"]["p50_ms"] / rep["package_latency"]["p50_ms"])
    assert_one_line_error(run("bench", str(tmp_path / "nope"), "--data", str(DEMO)), "nope")


def test_unknown_build_intent_is_one_line(tmp_path):
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--intents", "nope"),
                          "--intents", "'nope'")


def test_buckets_option_parses_lengths_none_and_rejects_junk(tmp_path):
    from edgekit.cli import _lengths
    from edgekit.errors import EdgekitError

    assert _lengths(None) is None and _lengths("none") == [] and _lengths("16, 24") == [16, 24]
    with pytest.raises(EdgekitError):
        _lengths("sixteen")
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--buckets", "16,x"),
                          "--buckets")
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--buckets", "2"),
                          "--buckets", ">= 3")
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--stages",
                              "teacher,fuse,export,package"), "stages run in this order")
