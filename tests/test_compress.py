"""The compression stages in a whole build: gates, rollback, a clear stop, resume."""

import json

import pytest

from edgekit.errors import EdgekitError
from edgekit.pipeline import BuildConfig, build
from edgekit.training import TrainConfig

from .conftest import DEMO

FAST = TrainConfig(epochs=3, batch_size=16, lr=5e-3, head_lr=1e-2)


def profile(tmp_path, **budget):
    text = f"""name = "test-phone"
description = "test profile"
runtimes = ["executorch", "onnx"]
primary_runtime = "executorch"
stages = ["teacher", "trim_vocab", "prune", "distill", "export", "package"]
[budget]
{chr(10).join(f"{k} = {v}" for k, v in budget.items())}
[compress]
vocab_budget = 330
param_share = 0.5
max_retries = 3
distill_epochs = 3
distill_lr = 0.005
word_pool = true
"""
    p = tmp_path / "phone.toml"
    p.write_text(text)
    return str(p)


def test_trim_gate_rolls_back_to_a_larger_vocabulary(tmp_path, tiny_bert):
    # zero tolerance: only the lossless (full task) vocabulary passes, after backing off from 330 pieces
    rep = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert),
                            target=profile(tmp_path, intent_drop_pts=0.0, slot_f1_drop_pts=0.0),
                            stages=["teacher", "trim_vocab", "export", "package"], train=FAST))
    trim = next(p for p in rep["passes"] if p["name"] == "trim_vocab")
    tries = trim["extra"]["tries"]
    assert len(tries) >= 2 and not tries[0]["passed"] and tries[-1]["passed"]
    assert tries[0]["setting"] == "vocabulary budget 330"
    assert trim["extra"]["tokenization_agreement_full"] == 1.0
    assert [s["name"] for s in rep["stages"]] == ["teacher", "trim_vocab", "export", "package"]


def test_unmeetable_budget_stops_with_stage_budget_and_best_figure(tmp_path, tiny_bert):
    out = tmp_path / "o"
    out.mkdir()
    (out / "model.pte").write_bytes(b"an earlier build's package")
    with pytest.raises(EdgekitError) as e:
        build(BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert),
                          target=profile(tmp_path, intent_drop_pts=-1.0), compress={"max_retries": 1}, train=FAST))
    msg = str(e.value)
    assert msg.startswith("stage trim_vocab:") and "intent_drop_pts <= -1.0" in msg and "best reached" in msg
    assert (out / "model.pte").read_bytes() == b"an earlier build's package"  # nothing written is corrupted
    rep = json.loads((out / "report.json").read_text())  # the report still parses: the teacher row is there
    assert [s["name"] for s in rep["stages"]] == ["teacher"]


def test_full_compression_build_and_resume(tmp_path, tiny_bert):
    target = profile(tmp_path, intent_drop_pts=100.0, slot_f1_drop_pts=100.0)
    out = tmp_path / "o"
    rep = build(BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), target=target, train=FAST))
    names = [s["name"] for s in rep["stages"]]
    assert names == ["teacher", "trim_vocab", "prune", "distill", "export", "package"]
    rows = {s["name"]: s for s in rep["stages"]}
    assert rows["distill"]["params"] < rows["trim_vocab"]["params"] < rows["teacher"]["params"]
    distill = next(p for p in rep["passes"] if p["name"] == "distill")
    assert distill["extra"]["share_of_teacher_nonembedding"] <= 0.5 + 1e-9
    assert distill["extra"]["word_pool"]  # the exported, packaged and reloaded student pools its words
    md = (out / "report.md").read_text()
    assert "| prune |" in md and "| distill |" in md
    # resume after distill: the student is reloaded, only export and package run again
    rep2 = build(BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), target=target, train=FAST,
                             resume=True))
    assert [s["seconds"] for s in rep2["stages"][:4]] == [s["seconds"] for s in rep["stages"][:4]]
    assert rep2["stages"][-1]["intent_acc"] == pytest.approx(rep["stages"][-1]["intent_acc"])
