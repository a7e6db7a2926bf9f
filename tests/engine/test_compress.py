"""The compression stages in a whole build: gates, back-off, the best try kept, partial reuse, a killed build."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from edgekit.engine import BuildConfig, build
from edgekit.engine.gating import BudgetMissed
from tests.conftest import DEMO, oos_csv

FAST = {"teacher": {"epochs": 3, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2},
        "package": {"bench_utterances": 0}, "decoding": {"compare_argmax": False}}
# stages, gates and the cache: no latency measured, no argmax graph exported beside the package's
# These tests are about stages, gates and the cache: one runtime (ONNX Runtime, the faster export) is enough.


def profile(tmp_path, **budget):
    text = f"""name = "test-phone"
description = "test profile"
runtimes = ["onnx"]
primary_runtime = "onnx"
stages = ["teacher", "trim_vocab", "prune", "distill", "export", "package"]
[budget]
{chr(10).join(f"{k} = {v}" for k, v in budget.items())}
[compress]
vocab_budget = 330
param_share = 0.5
max_retries = 3
[distill]
epochs = 3
lr = 0.005
augment = 0.0
novel = 0.0
word_pool = true
"""
    p = tmp_path / "phone.toml"
    p.write_text(text)
    return str(p)


def test_ios_states_only_its_differences_from_android():
    from edgekit.engine import resolve

    a = resolve(BuildConfig(data="x", out="y", target="android"))
    i = resolve(BuildConfig(data="x", out="y", target="ios"))
    assert i[0].name == "ios" and i[0].stages == a[0].stages and i[1] == a[1]
    assert a[1].compress.vocab_budget == 10000 and a[1].distill.word_pool and a[1].distill.epochs == 10


def test_trim_gate_judges_the_vocabulary_not_the_factorised_table(tmp_path, tiny_bert):
    """A factorised embedding is recovered by distillation, whose gate holds the student: the trim gate measures
    the same vocabulary unfactorised, so the full task vocabulary passes even a zero tolerance."""
    rep = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert),
                            target=profile(tmp_path, intent_drop_pts=0.0, slot_f1_drop_pts=0.0),
                            stages=["teacher", "trim_vocab", "export", "package"], settings=FAST,
                            sets=["compress.vocab_budget=0", "compress.embedding_rank=2", "compress.max_retries=0"]))
    trim = next(p for p in rep["passes"] if p["name"] == "trim_vocab")
    assert trim["extra"]["embedding_rank"] == 2 and trim["extra"]["svd_energy_kept"] < 1.0  # it did factorise
    assert trim["extra"]["tries"][0]["passed"] and rep["over_budget"] is None
    # what the gate did not judge is still shown: the factorised table's test score, before any distillation
    assert trim["metrics"]["intent_acc"] <= rep["stages"][0]["intent_acc"]


def test_trim_gate_backs_off_to_a_larger_vocabulary(tmp_path, tiny_bert):
    # zero tolerance: only the lossless (full task) vocabulary passes, after backing off from 330 pieces
    rep = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert),
                            target=profile(tmp_path, intent_drop_pts=0.0, slot_f1_drop_pts=0.0),
                            stages=["teacher", "trim_vocab", "export", "package"], settings=FAST))
    trim = next(p for p in rep["passes"] if p["name"] == "trim_vocab")
    tries = trim["extra"]["tries"]
    assert len(tries) >= 2 and not tries[0]["passed"] and tries[-1]["passed"]
    assert tries[0]["setting"] == "vocabulary budget 330"
    assert trim["extra"]["tokenization_agreement_full"] == 1.0
    assert tries[-1]["setting"] == "vocabulary budget none"
    assert [s["name"] for s in rep["stages"]] == ["teacher", "trim_vocab", "export", "package"]
    assert rep["over_budget"] is None
    # A budget above the task vocabulary keeps the same pieces as the full vocabulary this build settled on: only
    # trim_vocab (its own settings changed) runs again, and what follows is reused.
    above = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o2"), base_model=str(tiny_bert),
                              target=profile(tmp_path, intent_drop_pts=0.0, slot_f1_drop_pts=0.0),
                              stages=["teacher", "trim_vocab", "export", "package"], settings=FAST,
                              sets=["compress.vocab_budget=100000"]))
    assert [s["reused"] for s in above["stages"]] == [True, False, True, True]
    assert "full_vocab" not in next(p for p in above["passes"] if p["name"] == "trim_vocab")["extra"]
    # A budget that does cut (kept: the gate passes anything), or base words: another vocabulary, so a new export.
    for sets in (["compress.vocab_budget=330", "compress.max_retries=0"],
                 ["compress.vocab_budget=0", "compress.base_words=5"]):
        other = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o3"), base_model=str(tiny_bert),
                                  target=profile(tmp_path, intent_drop_pts=100.0, slot_f1_drop_pts=100.0),
                                  stages=["teacher", "trim_vocab", "export", "package"], settings=FAST, sets=sets))
        assert [s["reused"] for s in other["stages"]][:3] == [True, False, False], sets
        assert ("full_vocab" in next(p for p in other["passes"] if p["name"] == "trim_vocab")["extra"]) == (
            "compress.vocab_budget=330" in sets)
        # the report counts the base words with the task's pieces and says so
        md = (tmp_path / "o3" / "report.md").read_text()
        assert ("task and base vocabulary" in md) == ("compress.base_words=5" in sets), sets


def test_unmeetable_budget_ships_the_best_try_marked_or_fails_under_strict(tmp_path, tiny_bert):
    out = tmp_path / "o"
    out.mkdir()
    (out / "model.pte").write_bytes(b"an earlier build's package")
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), target=profile(tmp_path, intent_drop_pts=-1.0),
                      settings={**FAST, "compress": {"max_retries": 1}}, stages=["teacher", "trim_vocab", "export",
                                                                                   "package"], strict=True)
    with pytest.raises(BudgetMissed) as e:
        build(cfg)
    msg = str(e.value)
    assert e.value.exit_code == 3
    assert msg.startswith("stage trim_vocab:") and "intent_drop_pts <= -1.0" in msg and "best reached" in msg
    assert (out / "model.pte").read_bytes() == b"an earlier build's package"  # --strict: no package written
    rep = json.loads((out / "report.json").read_text())  # the report shows the tries that missed
    assert [s["name"] for s in rep["stages"]] == ["teacher", "trim_vocab"] and rep["over_budget"]
    # Without --strict the same build ships its best try, marked; the tries come from the cache.
    rep = build(BuildConfig(**{**cfg.__dict__, "strict": False}))
    assert [s["reused"] for s in rep["stages"][:2]] == [True, True]
    assert rep["over_budget"][0]["stage"] == "trim_vocab" and (out / "manifest.json").is_file()
    assert (out / "model.onnx").is_file() and "model.onnx" in json.loads((out / "manifest.json").read_text())["files"]
    assert "over budget" in (out / "report.md").read_text().lower()


def test_full_compression_build_then_a_distill_setting_reruns_only_from_distill(tmp_path, tiny_bert):
    target = profile(tmp_path, intent_drop_pts=100.0, slot_f1_drop_pts=100.0)
    out = tmp_path / "o"
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), target=target, settings=FAST)
    rep = build(cfg)
    names = [s["name"] for s in rep["stages"]]
    assert names == ["teacher", "trim_vocab", "prune", "distill", "export", "package"]
    rows = {s["name"]: s for s in rep["stages"]}
    assert rows["distill"]["params"] < rows["trim_vocab"]["params"] < rows["teacher"]["params"]
    distill = next(p for p in rep["passes"] if p["name"] == "distill")
    assert distill["extra"]["share_of_teacher_nonembedding"] <= 0.5 + 1e-9
    assert distill["extra"]["word_pool"]  # the exported, packaged and reloaded student pools its words
    md = (out / "report.md").read_text()
    assert "| prune |" in md and "| distill |" in md
    again = build(BuildConfig(**{**cfg.__dict__, "sets": ["distill.temperature=2.0"]}))
    assert [s["reused"] for s in again["stages"]] == [True, True, True, False, False, False]
    assert next(p for p in again["passes"] if p["name"] == "distill")["extra"]["temperature"] == 2.0
    # Another budget that keeps the same vocabulary: trim_vocab is gated again, prune and the distill try reused.
    looser = build(BuildConfig(**{**cfg.__dict__, "sets": ["budget.intent_drop_pts=99.0"]}))
    assert [s["reused"] for s in looser["stages"]] == [True, False, True, False, True, True]
    assert [s["key"] for s in looser["stages"][4:]] == [s["key"] for s in rep["stages"][4:]]


def test_gates_on_out_of_scope_data_judge_intent_accuracy_with_rejection_on(tmp_path, tiny_bert):
    """With out-of-scope utterances in dev, the trim and distill gates compare intent accuracy as the package
    answers (an out-of-scope utterance refused counts right), with the threshold chosen on each model's own dev,
    not the argmax's out-of-scope class."""
    csv = oos_csv(tmp_path)
    rep = build(BuildConfig(data=str(csv), out=str(tmp_path / "o"), base_model=str(tiny_bert),
                            target=profile(tmp_path, intent_drop_pts=100.0), settings=FAST))
    passes = {p["name"]: p for p in rep["passes"]}
    teacher = passes["teacher"]["extra"]["dev"]["rejecting"]
    n_oos = sum(line.endswith(",oos") for line in csv.read_text().splitlines())
    assert 0 < n_oos and teacher["oos_recall"] >= passes["teacher"]["extra"]["dev"]["oos_recall"]
    for stage in ("trim_vocab", "distill"):
        for t in passes[stage]["extra"]["tries"]:
            got = t["dev"]["rejecting"]
            assert t["drops"]["intent_drop_pts"] == round(100 * (teacher["intent_acc"] - got["intent_acc"]), 3)
            lo, hi = sorted((got["in_scope_acc"], got["oos_recall"]))
            assert lo - 1e-12 <= got["intent_acc"] <= hi + 1e-12
    # the gate's figures are the export stage's: the same student (no quantize stage here), policy and threshold
    export = passes["export"]["extra"]["decoding"]
    chosen = export["candidates"][export["policy"]]["dev"]
    kept = passes["distill"]["extra"]["tries"][-1]["dev"]["rejecting"]
    assert (kept["in_scope_acc"], kept["oos_recall"]) == pytest.approx((chosen["in_scope_acc"], chosen["oos_recall"]))
    assert "(rejection on: in scope " in (tmp_path / "o" / "report.md").read_text()


def test_distill_gate_backs_off_within_the_caps(tmp_path, tiny_bert):
    # no try can pass this budget: the gate backs off up to the cap, then ships the best try
    text = open(profile(tmp_path, intent_drop_pts=-100.0)).read().replace(
        "max_retries = 3", "max_retries = 3\nmax_param_share = 0.8")
    p = tmp_path / "caps.toml"
    p.write_text(text)
    rep = build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert), target=str(p),
                            settings={**FAST, "compress": {"vocab_budget": 0}}))
    tries = next(x for x in rep["passes"] if x["name"] == "distill")["extra"]["tries"]
    targets = [t["prune"]["target_params"] for t in tries]
    assert len(tries) >= 2 and targets == sorted(targets) and targets[1] > targets[0]
    teacher_nonemb = tries[0]["prune"]["target_params"] / 0.5
    assert max(targets) <= 0.8 * teacher_nonemb + 1  # never past the cap
    # a tiny student may beat its tiny teacher by a point after all; if not, the build says it is over budget
    assert tries[-1]["passed"] or "distill" in [o["stage"] for o in rep["over_budget"]]
    # the prune row shows the first target; when a larger try shipped, the report says so
    shipped = next(x for x in rep["passes"] if x["name"] == "distill")["extra"].get("shipped_prune")
    md = (tmp_path / "o" / "report.md").read_text()
    assert ("| prune (first try; the shipped student was pruned less" in md) == bool(shipped)
    assert shipped is None or shipped["target_params"] in targets[1:]


def test_a_build_killed_in_distill_reuses_teacher_trim_and_prune(tmp_path, tiny_bert):
    target = profile(tmp_path, intent_drop_pts=100.0, slot_f1_drop_pts=100.0)
    args = [sys.executable, "-m", "edgekit.cli", "build", "--data", str(DEMO), "--out", str(tmp_path / "o"),
            "--base-model", str(tiny_bert), "--target", target, "--set", "teacher.epochs=2",
            "--set", "distill.epochs=40", "--set", "decoding.compare_argmax=false", "--set",
            "package.bench_utterances=0", "--cache", str(tmp_path / "cache")]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen, t0 = [], time.time()
    for line in proc.stderr:  # kill it as soon as distillation starts
        seen.append(line)
        if "stage distill" in line:
            time.sleep(1)
            proc.send_signal(signal.SIGKILL)
            break
        assert time.time() - t0 < 300, "".join(seen[-20:])
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-20:])
    assert not list((tmp_path / "cache").glob("distill/*"))  # no half-written entry
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [s["reused"] for s in rep["stages"][:4]] == [True, True, True, False]
    assert "reused from the cache" in res.stderr
