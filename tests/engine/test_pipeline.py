"""A whole build on the demo data with a tiny random base model: contract of report, manifest and runtime."""

import json

import pytest

from edgekit.engine import BuildConfig, build
from edgekit.runtime import Package, Predictor
from tests.conftest import DEMO, oos_csv

BASIC = ["teacher", "export", "package"]
TEACHER = {"teacher": {"epochs": 4, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2}}
# The module's package: latency on 50 test utterances, not 200 (the report's latency rows need a figure, not a
# precise one)
BUILT = {**TEACHER, "package": {"bench_utterances": 50}}
NO_ARGMAX = {"decoding": {"compare_argmax": False}}  # builds that do not look at the argmax comparison
# Builds that test no ExecuTorch part: the web profile is android's on ONNX Runtime alone (an ExecuTorch lowering
# is most of a tiny build's time).
ONNX_ONLY = "web"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert):
    out = tmp_path_factory.mktemp("pkg")
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), stages=BASIC, settings=BUILT)
    rep = build(cfg)
    return out, rep


def test_report_contract(built):
    from tests.runtime.test_element_types import assert_table_types

    out, rep = built
    assert_table_types(out)  # an android package: int64, int32 and float32 only (docs/package-format.md R8)
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["stages"] == rep["stages"]
    assert [s["name"] for s in rep["stages"]] == ["teacher", "export", "package"]
    for s in rep["stages"]:
        assert {"name", "intent_acc", "slot_f1", "exact_match", "params", "size_bytes", "seconds"} <= s.keys()
        assert 0 <= s["intent_acc"] <= 1 and s["slot_f1"] is not None
    assert rep["task"] == "intent" and rep["target"] == "android"
    assert set(rep["latency"]) == {"executorch", "onnx"}
    assert all(v["threads"] == 1 and v["p50_ms"] > 0 for v in rep["latency"].values())
    assert rep["package"]["size_bytes"] == sum(b for f, b in rep["package"]["files"].items() if f != "model.onnx")
    # stage rows score the decoded graph; plain argmax sits alongside
    assert all(r["slot_f1_argmax"] is not None for r in rep["stages"][:2])
    # the tiny model learns the demo task well past chance (10 intents)
    assert rep["stages"][0]["intent_acc"] > 0.5
    md = (out / "report.md").read_text()
    assert "| teacher |" in md
    # the package scored by label (issue 57): its intents' supports are the test split, its picture beside the report
    by_label = next(p for p in rep["passes"] if p["name"] == "package")["extra"]["by_label"]
    assert sum(r["support"] for r in by_label["intents"]["rows"]) == rep["dataset"]["sizes"]["test"]
    assert by_label["intents"]["micro"]["f1"] == rep["stages"][-1]["intent_acc"]
    assert rep["plots"]["confusion"] == "confusion.png" and (out / "confusion.png").is_file()
    assert "## Scores by label" in md and "## Data check" in md and rep["data_check"]["total"] >= 0
    assert Package.load(out).strays() == []  # the build's new files are the build's, not the package's


def test_max_len_is_p99_rounded_to_8_and_buckets_below_it_reach_the_manifest(built):
    out, rep = built
    lengths = rep["dataset"]["lengths"]
    assert lengths["max_len"] % 8 == 0 and lengths["max_len"] >= lengths["p99"]
    assert lengths["buckets"] and all(b % 8 == 0 and b < lengths["max_len"] for b in lengths["buckets"])
    methods = Package.load(out).buckets("executorch")
    assert [m["max_len"] for m in methods] == lengths["buckets"] + [lengths["max_len"]]
    assert methods[-1]["method"] == "forward"  # the full length keeps the default method name
    used = rep["latency"]["executorch"]["buckets"]
    assert sum(used.values()) == min(BUILT["package"]["bench_utterances"], rep["dataset"]["sizes"]["test"])  # each one


def test_exported_artifacts_agree_with_eager(built):
    out, rep = built
    export = next(p for p in rep["passes"] if p["name"] == "export")
    for rt in ("executorch", "onnx"):
        assert export["extra"][rt]["extra"]["agreement_with_eager"] >= 0.995
    # no quantize stage: both graphs are held against the FP32 model (tests/test_integration.py: with one)
    assert {export["extra"][rt]["extra"]["against"] for rt in ("executorch", "onnx")} == {"fp32"}
    assert "| onnx | FP32 |" in (out / "report.md").read_text()


def test_manifest_and_both_runtimes_answer_the_same(built):
    out, _ = built
    pkg = Package.load(out)
    assert pkg.manifest["profile"] == "android" and set(pkg.manifest["models"]) == {"executorch", "onnx"}
    import onnx

    # the phone's ONNX graph keeps Add + LayerNormalization (fuse.skip_layer_norm = false), and says so
    assert pkg.manifest["onnx_disabled_optimizers"] == ["SkipLayerNormFusion"]
    assert "SkipLayerNormalization" not in {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    et, ox = Predictor.open(pkg, "executorch"), Predictor.open(pkg, "onnx")
    for text in ["wake me up at 7 am tomorrow", "", "🎵 play 東京 by queen!", "text mom " + "very " * 200]:
        a, b = et.predict(text), ox.predict(text)
        assert a["intent"] == b["intent"] and a.get("tags") == b.get("tags")
        assert set(a) >= {"intent", "confidence", "slots"} and (0 < a["confidence"] <= 1 if text else
                                                                 a["confidence"] == 0.0)
    assert et.predict("text mom " + "very " * 200)["truncated"]


def test_an_utterance_without_a_word_answers_out_of_scope_without_the_model(built):
    out, _ = built
    oos = Package.load(out).manifest["decoding"]["oos_answer"]
    for runtime in ("executorch", "onnx"):
        pred, calls = Predictor.open(out, runtime), []
        run = pred.backend.run
        pred.backend.run = lambda *x: calls.append(1) or run(*x)
        for text in ["", "   ", "\t\n\u3000"]:
            for reject in (True, False):
                assert pred.predict(text, reject=reject) == {"intent": oos, "confidence": 0.0, "slots": [],
                                                             "tags": [], "path_confidence": 0.0}
        # words of characters that normalize to nothing ([unk] each) say nothing either: an O for each word
        for text, words in [("\u200b", 1), ("\ufeff \u200d\u200b \x07", 3)]:
            assert pred.predict(text) == {"intent": oos, "confidence": 0.0, "slots": [], "tags": ["O"] * words,
                                          "path_confidence": 0.0}
        assert pred.predict_batch(["\u200b", ""]) == [pred.predict("\u200b"), pred.predict("")]
        with pytest.raises(ValueError, match="unknown intent"):  # its options are still checked
            pred.predict("", allow_intents=["nope"])
        assert not calls
        assert pred.predict("play queen")["confidence"] > 0 and calls  # a word: the model answers
        assert pred.predict("play \u200b queen")["confidence"] > 0  # [unk] among words with pieces: answered
        # words only past the read limit: nothing read, said so
        far = pred.predict(" " * 5000 + "play queen", warn=False)
        assert far["intent"] == oos and far["truncated"] == {"chars": 0, "words": 0}
    # a cascade does not ask its server about it (this one is not there: asking would say "unreachable")
    pred = Predictor.open(out, "onnx", fallback_url="http://127.0.0.1:9", escalate_below=1.0)
    assert pred.predict(" ") == {"intent": oos, "confidence": 0.0, "slots": [], "tags": [], "path_confidence": 0.0,
                                 "escalated": False}
    assert pred.predict("play queen")["fallback"] == "unreachable"  # a word below 1.0: asked


def test_corrupted_package_is_refused(built, tmp_path):
    import shutil

    from edgekit.runtime.package import PackageError

    copy = tmp_path / "pkg"
    shutil.copytree(built[0], copy)
    (copy / "labels.json").write_text("{}")
    with pytest.raises(PackageError, match="labels.json: .*edited"):  # its size, or its sha256
        Package.load(copy)


def test_eval_runs_the_package_and_compares_with_eager(built):
    from edgekit.tools.package_eval import evaluate_package

    out, rep = built
    res = evaluate_package(out, DEMO, "onnx", reject=False)
    assert res["n"] == rep["dataset"]["sizes"]["test"]
    assert res["agreement_with_eager"] >= 0.995
    assert res["intent_acc"] == pytest.approx(rep["stages"][0]["intent_acc"], abs=0.02)
    shipped = evaluate_package(out, DEMO, "executorch")  # rejection on, as the app gets it
    assert shipped["agreement_with_eager"] >= 0.995 and shipped["invalid_bio"] == 0


def test_eval_holds_out_what_the_build_held_out(built, tmp_path, monkeypatch):
    # the demo data has no test split: the build drew one with its --seed, which eval reads from report.json
    import shutil

    import edgekit.tools.package_eval as ev

    out, _ = built
    copy = tmp_path / "pkg"
    shutil.copytree(out, copy)
    rep = json.loads((copy / "report.json").read_text())
    (copy / "report.json").write_text(json.dumps(rep | {"config": rep["config"] | {"seed": 3}}))
    seeds = []
    import edgekit.data.dataset as data

    real = data.load_dataset
    monkeypatch.setattr(data, "load_dataset", lambda *a: seeds.append(a[2]) or real(*a))
    res = ev.evaluate_package(copy, DEMO, "onnx", compare_eager=False)
    assert seeds == [3] and res["n"] == len(real(DEMO, None, 3).splits["test"])


def rep_tags(out) -> list[str]:
    return json.loads((out / "labels.json").read_text())["slot_tags"]


def test_decoding_graph_in_report(built):
    out, rep = built
    export = next(p for p in rep["passes"] if p["name"] == "export")["extra"]
    d = export["decoding"]
    # no out-of-scope data: rejection is off by default, and the report says recall is unknown
    assert d["policy"].startswith("threshold") and d["threshold"] == 0 and d["oos_far"] == 0
    assert d["oos_recall"] == "unknown"
    ch = d["intent_slot_choice"]  # measured with the teacher on dev; the graph carries the chosen table
    assert ch["used"] == (ch["teacher_dev_slot_f1_with"] >= ch["teacher_dev_slot_f1_without"])
    assert (d["intent_slots"] is not None) == ch["used"]
    # learned transitions (on by default): fitted on train, the scores in the record the graph is rebuilt from
    fit, tr = d["transitions_fit"], d["transitions"]
    assert fit["train_nll_after"] < fit["train_nll_before"] and fit["utterances"] > 0
    assert set(tr) == {"start", "unary", "from_b", "from_i"} and all(len(v) == len(rep_tags(out)) for v in tr.values())
    for rt in ("executorch", "onnx"):
        e = export[rt]["extra"]["decoding"]
        assert e["constrained"]["invalid_bio"] == 0
        assert e["rejected_share"] == 0  # nothing valid is refused
        lat = rep["latency"][rt]
        assert lat["without_decoding"]["p50_ms"] > 0 and "decoding_overhead" in lat
    md = (out / "report.md").read_text()
    assert "## Decoding in the graph" in md and "out-of-scope recall is unknown" in md
    assert "**Out-of-scope recall is unknown**" in md
    # the confidence temperature: fitted on dev, kept only when it lowers the dev calibration error
    err = d["calibration_error"]
    assert d["temperature_fit"] > 0 and set(err) == {"dev_before", "dev_after", "test_before", "test_after"}
    assert d["temperature"] == (d["temperature_fit"] if err["dev_after"] < err["dev_before"] else 1.0)
    dec = Package.load(out).manifest["decoding"]
    assert dec["score"] == "confidence" and dec["temperature"] == d["temperature"] and dec["threshold"] == 0
    # one model stage (the teacher) is no size-against-accuracy plot; no out-of-scope data, no curve; the package's
    # confusion picture (issue 57) is drawn for every build with a package stage
    assert rep["plots"] == {"confusion": "confusion.png"}
    assert not (out / "stages.png").exists() and not (out / "oos_curve.png").exists()


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_allow_intents_restricts_every_answer(built, runtime):
    from edgekit.data.dataset import load_dataset

    out, _ = built
    p = Predictor.open(out, runtime)
    allow = p.labels["intents"][:2]
    test = load_dataset(DEMO).splits["test"]
    assert {p.predict(ex.text, allow_intents=allow, reject=False)["intent"] for ex in test} <= set(allow)
    assert {p.predict(ex.text, allow_intents=allow)["intent"] for ex in test} <= set(allow) | {"oos"}
    with pytest.raises(ValueError, match="unknown intent"):
        p.predict("hi", allow_intents=["dance"])


def test_same_build_again_reuses_every_stage(built, tiny_bert, tmp_path):
    out = tmp_path / "again"
    rep = build(BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), stages=BASIC, settings=BUILT))
    assert [s["reused"] for s in rep["stages"]] == [True, True, True]
    strip = ("reused", "key")
    assert [{k: v for k, v in s.items() if k not in strip} for s in rep["stages"]] == \
        [{k: v for k, v in s.items() if k not in strip} for s in built[1]["stages"]]
    assert Package.load(out).manifest["files"] == Package.load(built[0]).manifest["files"]  # published into OUT
    assert rep["config"]["settings"]["teacher"]["epochs"] == 4  # the resolved settings are recorded


def test_changed_training_line_retrains_from_the_teacher(built, tiny_bert, tmp_path):
    lines = DEMO.read_text().splitlines()
    lines[0] = lines[0].replace("laundry", "cooking")  # one training utterance changed (same length: spans hold)
    data = tmp_path / "demo.jsonl"
    data.write_text("\n".join(lines) + "\n")
    rep = build(BuildConfig(data=str(data), out=str(tmp_path / "o"), base_model=str(tiny_bert), stages=BASIC,
                            target=ONNX_ONLY, settings={**TEACHER, "package": {"buckets": [], "bench_utterances": 0},
                                                        **NO_ARGMAX}))
    assert [s["reused"] for s in rep["stages"]] == [False, False, False]
    assert rep["stages"][0]["key"] != built[1]["stages"][0]["key"]


def test_intent_only_csv_build(tmp_path, tiny_bert, stage_cache):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    csv = tmp_path / "intents.csv"
    csv.write_text("query,intent\n" + "".join(f'"{r["text"]}",{r["intent"]}\n' for r in rows))
    out = tmp_path / "pkg"
    rep = build(BuildConfig(data=str(csv), out=str(out), base_model=str(tiny_bert), stages=BASIC,
                            settings={"teacher": {"epochs": 1, "steps_limit": 3},
                                      "package": {"buckets": [], "bench_utterances": 20}, **NO_ARGMAX}))
    assert rep["dataset"]["format"] == "csv" and rep["dataset"]["slot_tags"] == 0
    assert all(s["slot_f1"] is None for s in rep["stages"])
    # decoding.compare_argmax = false: no graph without decoding is exported, measured or reported
    export = next(p for p in rep["passes"] if p["name"] == "export")["extra"]
    for rt in ("executorch", "onnx"):
        assert not {"argmax", "raw_parity", "raw_bytes"} & export[rt]["extra"]["decoding"].keys()
        assert rep["latency"][rt]["p50_ms"] > 0 and "without_decoding" not in rep["latency"][rt]
    key = next(s["key"] for s in rep["stages"] if s["name"] == "export")
    assert (stage_cache / "export" / key).is_dir() and not list((stage_cache / "export" / key).rglob("raw.*"))
    md = (out / "report.md").read_text()  # argmax slot F1, slot F1 (no slots), argmax invalid BIO: not there
    assert "| executorch | — | — | — | 0 |" in md and "not exported in this build" in md
    assert "The graph without decoding was not exported" in md
    pkg = Package.load(out)
    assert pkg.manifest["outputs"] == ["intent", "confidence"]
    for rt in ("executorch", "onnx"):
        ans = Predictor.open(pkg, rt).predict("call mom", reject=False)
        assert ans["slots"] == [] and ans["intent"] in pkg.labels["intents"]


def test_out_of_scope_data_gets_a_calibrated_threshold_and_a_curve(tmp_path, tiny_bert):
    """Data with an `oos` class: four policies calibrated on dev, the one with the most dev recall shipped, its
    test curve in the report (table and PNG), and the package refuses as the curve's chosen point says."""
    csv = oos_csv(tmp_path)
    out = tmp_path / "pkg"
    rep = build(BuildConfig(data=str(csv), out=str(out), base_model=str(tiny_bert), stages=BASIC, target=ONNX_ONLY,
                            settings={**TEACHER, "package": {"buckets": [], "bench_utterances": 0}, **NO_ARGMAX}))
    d = next(p for p in rep["passes"] if p["name"] == "export")["extra"]["decoding"]
    cands = d["candidates"]
    assert {(c["oos_in_softmax"], c["score"]) for c in cands.values()} == {(a, b) for a in (True, False)
                                                                           for b in ("confidence", "energy")}
    assert d["policy"] == max(cands, key=lambda k: (cands[k]["dev"]["oos_recall"], cands[k]["dev"]["in_scope_acc"]))
    assert all(0.5 <= c["dev_auroc"] <= 1 for c in cands.values())  # the tiny model separates better than chance
    c = d["oos_curve"]
    rec = [p["oos_recall"] for p in c["points"]]
    assert c["points"][0]["threshold"] is None and rec == sorted(rec)
    shipped = next(p for p in rep["passes"] if p["name"] == "export")["extra"]["onnx"]["extra"]["decoding"]
    # no quantization: the runtime refuses what the eager curve's chosen point says (rounding aside)
    assert shipped["with_rejection"]["oos_recall"] == pytest.approx(c["chosen"]["oos_recall"], abs=0.02)
    assert shipped["with_rejection"]["in_scope_acc"] == pytest.approx(c["chosen"]["in_scope_acc"], abs=0.02)
    md = (out / "report.md").read_text()
    assert "](oos_curve.png)" in md and "| threshold | in-scope acc | OOS recall |" in md
    assert (out / "oos_curve.png").read_bytes()[:4] == b"\x89PNG" and Package.load(out).strays() == []


def test_profile_lists_op_times_and_adds_the_top_10_to_the_report(built, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from edgekit.cli import app

    pkg = tmp_path / "pkg"
    shutil.copytree(built[0], pkg)
    r = CliRunner().invoke(app, ["profile", str(pkg), "--data", str(DEMO), "--n", "30", "--out",
                                 str(tmp_path / "profile.json")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "profile.json").read_text())
    # the PyPI ExecuTorch wheel writes no ETDump: the package's ONNX model is profiled, and the note says so
    assert res["runtime"] == "onnx" and "event tracer" in res["note"]
    rows = res["rows"]
    assert len(rows) >= 5 and all(r["ms_per_run"] > 0 and r["count"] > 0 for r in rows)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert [r["ms_per_run"] for r in rows] == sorted((r["ms_per_run"] for r in rows), reverse=True)
    assert 0.3 < res["covered"] <= 1.0  # the ops explain most of a call; never more than all of it
    md = (pkg / "report.md").read_text()
    assert "## Hotspots (onnx" in md and md.count("| " + rows[0]["op"] + " |") >= 1
    assert Package.load(pkg).strays() == []


def test_quantized_build_reuses_the_teacher_and_rebuilds_int8_from_its_record(built, tiny_bert, tmp_path):
    out = tmp_path / "int8"
    stages = ["teacher", "quantize", "export", "fuse", "package"]
    settings = {**TEACHER, "quantize": {"embedding_bits": 8, "calib_samples": 64, "method": "minmax"},
                "package": {"buckets": [], "bench_utterances": 50}, **NO_ARGMAX}
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), stages=stages, settings=settings)
    rep = build(cfg)
    assert [s["name"] for s in rep["stages"]] == stages
    assert [s["reused"] for s in rep["stages"]] == [True, False, False, False, False]  # the fixture's teacher
    q = next(p for p in rep["passes"] if p["name"] == "quantize")
    assert rep["quant_layers"] and q["extra"]["quantized_linears"] > 0 and q["bytes_after"] < q["bytes_before"]
    onnx_q = next(p for p in rep["passes"] if p["name"] == "export")["extra"]["onnx"]["extra"]["quantize"]
    assert onnx_q["quantized_matmuls"] > 0 and onnx_q["nodes_after"] > onnx_q["nodes_before"]
    md = (out / "report.md").read_text()
    assert "## Quantization (INT8)" in md and "| fuse (onnx) |" in md and "ExecuTorch p50 / p99 ms" in md
    # two model stages: the size-against-accuracy plot, linked, beside the package and not a stray file of it
    assert (out / "stages.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep["plots"] == {"stages": "stages.png", "confusion": "confusion.png"}
    assert "](stages.png)" in md and Package.load(out).strays() == []
    fuse = next(p for p in rep["passes"] if p["name"] == "fuse")["extra"]
    assert fuse["onnx"]["nodes_after"] < fuse["onnx"]["nodes_before"] and fuse["onnx"]["agreement"] >= 0.995
    rows = {r["name"]: r for r in rep["stages"]}
    for name in ("export", "fuse", "package"):  # latency columns: ExecuTorch and ONNX Runtime p50/p99
        assert all(rows[name]["latency"][rt]["p99_ms"] >= rows[name]["latency"][rt]["p50_ms"] > 0
                   for rt in ("executorch", "onnx"))
    assert rows["export"]["latency"]["onnx"] == rep["latency"]["onnx"]["unfused"]  # before fusion
    assert "latency" not in rows["quantize"]  # not an exported graph
    pkg = Package.load(out)
    for rt in ("executorch", "onnx"):
        assert Predictor.open(pkg, rt).predict("play some jazz")["intent"] in pkg.labels["intents"] + ["oos"]
    # A rejection threshold (export setting): quantize is reused, and its INT8 model rebuilt from the record.
    again = build(BuildConfig(**{**cfg.__dict__, "sets": ["decoding.oos_far=0.05", "package.bench_utterances=0"]}))
    assert [s["reused"] for s in again["stages"]] == [True, True, False, False, False]
    e1 = next(p for p in rep["passes"] if p["name"] == "export")["extra"]["executorch"]
    e2 = next(p for p in again["passes"] if p["name"] == "export")["extra"]["executorch"]
    assert e2["metrics"]["intent_acc"] == e1["metrics"]["intent_acc"]  # the same INT8 model, decoded the same
    for rt in ("executorch", "onnx"):  # the threshold was set to reject 5% of dev: on test of the same order
        share = next(p for p in again["passes"] if p["name"] == "export")["extra"][rt]["extra"]["decoding"]
        assert 0 < share["rejected_share"] < 0.2


def test_data_key_leaves_out_an_out_folder_inside_the_data_folder(tmp_path):
    from edgekit.engine.keys import data_files as _data_files

    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "seq.in").write_text("a b\n")
    (data / "build").mkdir()
    (data / "build" / "report.json").write_text("{}")  # what a build with --out data/build wrote
    assert _data_files(str(data), str(data / "build")) == [data / "train" / "seq.in"]
    assert len(_data_files(str(data), str(tmp_path / "elsewhere"))) == 2  # can fail: OUT elsewhere keeps them all


def _relabel_first(path):
    """The first utterance of a JSONL file given another of the file's intents."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    other = next(r["intent"] for r in rows if r["intent"] != rows[0]["intent"])
    rows[0]["intent"] = other
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_data_key_covers_the_data_wherever_out_is(tmp_path, tiny_bert):
    """OUT equal to the data folder, or containing it: a label changed in the data changes the key (both failed
    before: the data files were left out of the key with OUT's)."""
    from edgekit.engine.runner import prepare

    for case in ("same", "contains"):
        out = tmp_path / case
        data = out if case == "same" else out / "data"
        data.mkdir(parents=True)
        (data / "train.jsonl").write_text(DEMO.read_text())
        cfg = BuildConfig(data=str(data), out=str(out), base_model=str(tiny_bert))
        before = prepare(cfg).input_digest
        (out / "report.json").write_text("{}")  # what a build writes into OUT leaves the key as it was
        assert prepare(cfg).input_digest == before, case
        _relabel_first(data / "train.jsonl")
        assert prepare(cfg).input_digest != before, case


def test_a_build_into_its_own_data_folder_retrains_on_changed_data_and_reuses_on_the_same(tmp_path, tiny_bert):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(DEMO.read_text())
    cfg = BuildConfig(data=str(data), out=str(data), base_model=str(tiny_bert), stages=BASIC, target=ONNX_ONLY,
                      settings={"teacher": {"epochs": 1, "steps_limit": 3},
                                "package": {"buckets": [], "bench_utterances": 0}, **NO_ARGMAX})
    build(cfg)
    assert [s["reused"] for s in build(cfg)["stages"]] == [True, True, True]  # its own package is not data
    _relabel_first(data / "train.jsonl")
    assert not build(cfg)["stages"][0]["reused"]  # the teacher learns the changed data
