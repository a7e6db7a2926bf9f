"""A build runs the data check in prepare, before any training: its summary in report.json and report.md's section,
--strict-data refusing the build in one line, and no cache key moved by either option."""

import dataclasses

import pytest

from edgekit.engine import BuildConfig
from edgekit.engine.keys import key_of
from edgekit.errors import EdgekitError
from edgekit.reporting.data_check import lines
from tests.data.test_check import dataset

ROWS = {"train": ["play queen|O B-artist|Play", "play queen|O B-artist|Play", "play abba|O B-artist|Play"]}


def test_the_build_checks_its_data_and_reports_it(tmp_path, tiny_bert):
    from edgekit.engine.report import report
    from edgekit.engine.runner import prepare

    dataset(tmp_path / "d", **ROWS)
    cfg = BuildConfig(data=str(tmp_path / "d"), out=str(tmp_path / "out"), base_model=str(tiny_bert))
    ctx = prepare(cfg)
    check = report(ctx)["data_check"]
    assert check["counts"] == {"duplicate": 1, "rare_intent": 2, "few_slot_values": 1} and check["total"] == 4
    first = check["findings"][0]
    assert (first["kind"], first["line"], first["count"]) == ("duplicate", 2, 2)
    assert first["file"] == str(tmp_path / "d" / "train" / "seq.in")
    md = lines(report(ctx))
    assert md[1] == "## Data check" and "| duplicate | 1 | `" in "\n".join(md)
    assert lines({"dataset": {}}) == []  # a report from before the check: no section

    # --strict-data: refused before any training, naming the first finding; --label-issues and --strict-data
    # are in no stage's key
    with pytest.raises(EdgekitError, match=r"^--strict-data: 4 data findings in .*seq.in:2: duplicate: 'play queen'"):
        prepare(dataclasses.replace(cfg, strict_data=True))
    other = prepare(dataclasses.replace(cfg, label_issues=True))  # prepare alone: the search runs in build()
    assert other.input_digest == ctx.input_digest
    assert key_of(other, "teacher", other.input_digest) == key_of(ctx, "teacher", ctx.input_digest)
    # the search judges with the build's own base model (here the tiny one, not MiniLM)
    from edgekit.engine.runner import label_issues

    summary = label_issues(other)
    assert summary["config"]["base_model"] == str(tiny_bert) and (tmp_path / "out" / "label_issues.jsonl").is_file()


def test_clean_data_passes_strict_data(tmp_path, tiny_bert):
    from edgekit.engine.report import report
    from edgekit.engine.runner import prepare

    rows = [f"play song{i}|O B-artist|Play" for i in range(10)] + [f"what time is it {i}|O O O O O|Time"
                                                                   for i in range(8)]
    dataset(tmp_path / "d", train=rows)
    ctx = prepare(BuildConfig(data=str(tmp_path / "d"), out=str(tmp_path / "out"), base_model=str(tiny_bert),
                              strict_data=True))
    assert ctx.data_check == {"total": 0, "counts": {}, "findings": []}
    assert lines(report(ctx))[3].startswith("No findings")


def test_label_issues_in_the_report(tmp_path):
    from edgekit.engine.report import LABEL_ISSUES, plots_listed

    issues = {"intent": {"rows": 200, "flagged": 3, "unjudged": 0, "oof_accuracy": 0.95},
              "slots": {"rows": 180, "words": 900, "flagged": 7, "oof_accuracy": 0.9}, "file": LABEL_ISSUES}
    md = lines({"label_issues": issues})
    assert md[-1] == ("Label issues (train split; `label_issues.jsonl` ranks them): intent: 3 of 200 utterances "
                      "flagged, out-of-fold accuracy 95.00%; slots: 7 of 180 utterances flagged, out-of-fold tag "
                      "accuracy per word 90.00%.")
    # an earlier build's search is edgekit's own file: listed, so a build without --label-issues removes it
    (tmp_path / "report.json").write_text('{"plots": {"stages": "stages.png"}, "label_issues": {"intent": {}}}')
    assert plots_listed(tmp_path) == ["stages.png", LABEL_ISSUES]
    (tmp_path / "report.json").write_text('{"plots": {}, "label_issues": null}')
    assert plots_listed(tmp_path) == []
