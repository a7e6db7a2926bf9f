"""`edgekit eval --out`: the files it writes, and the folders it refuses."""

import json

import pytest

from edgekit.data.formats import Example
from edgekit.scoring.score import by_label, score
from edgekit.tools.package_eval import write_outputs
from tests.cli.test_cli import assert_one_line_error, run
from tests.conftest import DEMO

LABELS = {"intents": ["play", "stop"], "slot_tags": ["O", "B-song", "I-song"], "oos_label": None}


def test_out_inside_a_package_is_refused_in_one_line(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "manifest.json").write_text('{"created_by": "edgekit 0.4.0"}')
    # checked before the package is opened: the package itself, a folder inside it, and a file
    for out in (pkg, pkg / "eval" / "deeper"):
        assert_one_line_error(run("eval", str(pkg), "--data", str(DEMO), "--out", str(out)), f"--out {out}",
                              "manifest.json", "verify")
    assert sorted(p.name for p in pkg.iterdir()) == ["manifest.json"]  # nothing written, no folder made
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "manifest.json").write_text('{"created_by": "edgekit 0.3.0"}')  # another package: the same strays
    assert_one_line_error(run("eval", str(pkg), "--data", str(DEMO), "--out", str(other / "eval")), "manifest.json")
    # a manifest.json that is no edgekit package's (a web app's) does not stop an evaluation beside it
    web = tmp_path / "site"
    web.mkdir()
    (web / "manifest.json").write_text('{"name": "my app", "start_url": "/"}')
    assert "--out" not in run("eval", str(pkg), "--data", str(DEMO), "--out", str(web / "eval")).stderr
    (tmp_path / "f.txt").write_text("")
    assert_one_line_error(run("eval", str(pkg), "--data", str(DEMO), "--out", str(tmp_path / "f.txt")),
                          "a file, not a folder")


def test_files_written(tmp_path):
    examples = [Example(["play", "hey", "jude"], "play", ["O", "B-song", "I-song"]),
                Example(["stop", "it"], "stop", ["O", "O"]),
                Example(["play", "help"], "play", ["O", "B-song"])]
    answers = [{"intent": "play", "confidence": 0.9, "path_confidence": 0.7, "tags": ["O", "B-song", "O"]},
               {"intent": "stop", "confidence": 0.8, "path_confidence": 0.8, "tags": ["O", "O"]},
               {"intent": "stop", "confidence": 0.6, "path_confidence": 0.9, "tags": ["O", "B-song"]}]
    res = {"package": "pkg", "runtime": "onnx", "split": "test", **score(examples, answers, LABELS),
           "by_label": by_label(examples, answers, LABELS)}
    out = tmp_path / "eval"
    written = write_outputs(out, res, examples, answers, True)
    assert sorted(p.name for p in out.iterdir()) == ["confusion.png", "errors.jsonl", "eval.json", "labels.md"]
    assert written["errors_count"] == 2 and json.loads((out / "eval.json").read_text()) == res | {"written": written}
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [(e["index"], e["wrong"]) for e in errors] == [(2, ["intent"]), (0, ["slots"])]  # path 0.9, then 0.7
    assert errors[1]["answer"]["slots"] == [{"slot": "song", "value": "hey", "words": [1, 2]}]
    md = (out / "labels.md").read_text()
    # every label, lowest F1 first, ties the larger support first: play (recall 1/2), then stop (precision 1/2)
    assert md.index("| play | 66.67 | 100.00 | 50.00 | 2 | 1 |") < md.index("| stop | 66.67 | 50.00 | 100.00 | 1 | 2 |")
    assert "| song | 50.00 | 50.00 | 50.00 | 2 | 2 |" in md


@pytest.mark.parametrize("n", [3, 8])
def test_report_section_shows_the_worst_few(n):
    """report.md: the 5 lowest-F1 intents with their support, whatever the number of labels."""
    from edgekit.reporting.labels import WORST, by_label_section

    # n{k} has 10 utterances, k of them answered as "zz" (never gold): recall (10 - k) / 10, precision 1
    gold = [f"n{k}" for k in range(n) for _ in range(10)]
    pred = [f"n{k}" if j >= k else "zz" for k in range(n) for j in range(10)]
    ex = [Example(["w"], g) for g in gold]
    by = by_label(ex, [{"intent": p} for p in pred], {"intents": [f"n{k}" for k in range(n)], "slot_tags": []})
    rep = {"passes": [{"name": "package", "extra": {"by_label": {"runtime": "onnx", "split": "test", **by}}}],
           "plots": {"confusion": "confusion.png"}}
    lines = by_label_section(rep)
    rows = [ln.split(" | ")[0][2:] for ln in lines if ln.startswith("| n") or ln.startswith("| zz")]
    worst = ["zz"] + [f"n{k}" for k in range(n - 1, -1, -1)]  # zz: F1 0; then the lowest recall first
    assert rows == worst[:WORST]
    assert f"| zz | 0.00 | 0.00 | 0.00 | 0 | {sum(range(n))} |" in lines
    assert lines[-1] == "![intent confusion, row-normalised](confusion.png)"
    assert by_label_section({"passes": [{"name": "package", "extra": {}}]}) == []  # a build from before: none
