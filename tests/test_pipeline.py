"""A whole build on the demo data with a tiny random base model: contract of report, manifest and runtime."""

import json

import pytest

from edgekit.pipeline import BuildConfig, build
from edgekit.runtime import Package, Predictor
from edgekit.training import TrainConfig

from .conftest import DEMO

BASIC = ["teacher", "export", "package"]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert):
    out = tmp_path_factory.mktemp("pkg")
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), stages=BASIC,
                      train=TrainConfig(epochs=4, batch_size=16, lr=5e-3, head_lr=1e-2))
    rep = build(cfg)
    return out, rep


def test_report_contract(built):
    out, rep = built
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
    assert "| teacher |" in (out / "report.md").read_text()


def test_max_len_is_p99_rounded_to_8_and_buckets_below_it_reach_the_manifest(built):
    out, rep = built
    lengths = rep["dataset"]["lengths"]
    assert lengths["max_len"] % 8 == 0 and lengths["max_len"] >= lengths["p99"]
    assert lengths["buckets"] and all(b % 8 == 0 and b < lengths["max_len"] for b in lengths["buckets"])
    methods = Package.load(out).buckets("executorch")
    assert [m["max_len"] for m in methods] == lengths["buckets"] + [lengths["max_len"]]
    assert methods[-1]["method"] == "forward"  # the full length keeps the default method name
    used = rep["latency"]["executorch"]["buckets"]
    assert sum(used.values()) == min(200, rep["dataset"]["sizes"]["test"])  # every measured utterance ran one


def test_exported_artifacts_agree_with_eager(built):
    _, rep = built
    export = next(p for p in rep["passes"] if p["name"] == "export")
    for rt in ("executorch", "onnx"):
        assert export["extra"][rt]["extra"]["agreement_with_eager"] >= 0.995


def test_manifest_and_both_runtimes_answer_the_same(built):
    out, _ = built
    pkg = Package.load(out)
    assert pkg.manifest["profile"] == "android" and set(pkg.manifest["models"]) == {"executorch", "onnx"}
    et, ox = Predictor.open(pkg, "executorch"), Predictor.open(pkg, "onnx")
    for text in ["wake me up at 7 am tomorrow", "", "🎵 play 東京 by queen!", "text mom " + "very " * 200]:
        a, b = et.predict(text), ox.predict(text)
        assert a["intent"] == b["intent"] and a.get("tags") == b.get("tags")
        assert set(a) >= {"intent", "confidence", "slots"} and 0 < a["confidence"] <= 1
    assert et.predict("text mom " + "very " * 200)["truncated"]


def test_corrupted_package_is_refused(built, tmp_path):
    import shutil

    from edgekit.runtime.package import PackageError

    copy = tmp_path / "pkg"
    shutil.copytree(built[0], copy)
    (copy / "labels.json").write_text("{}")
    with pytest.raises(PackageError, match="sha256"):
        Package.load(copy)


def test_eval_runs_the_package_and_compares_with_eager(built):
    from edgekit.evaluate import evaluate_package

    out, rep = built
    res = evaluate_package(out, DEMO, "onnx", reject=False)
    assert res["n"] == rep["dataset"]["sizes"]["test"]
    assert res["agreement_with_eager"] >= 0.995
    assert res["intent_acc"] == pytest.approx(rep["stages"][0]["intent_acc"], abs=0.02)
    shipped = evaluate_package(out, DEMO, "executorch")  # rejection on, as the app gets it
    assert shipped["agreement_with_eager"] >= 0.995 and shipped["invalid_bio"] == 0


def test_decoding_graph_in_report(built):
    out, rep = built
    export = next(p for p in rep["passes"] if p["name"] == "export")["extra"]
    d = export["decoding"]
    assert d["policy"].startswith("threshold") and 0 < d["threshold"] < 1 and d["oos_far"] == 0.05
    ch = d["intent_slot_choice"]  # measured with the teacher on dev; the graph carries the chosen table
    assert ch["used"] == (ch["teacher_dev_slot_f1_with"] >= ch["teacher_dev_slot_f1_without"])
    assert (d["intent_slots"] is not None) == ch["used"]
    for rt in ("executorch", "onnx"):
        e = export[rt]["extra"]["decoding"]
        assert e["constrained"]["invalid_bio"] == 0
        # the threshold was set to reject 5% of dev: on test the share is of the same order
        assert 0 < e["rejected_share"] < 0.2
        lat = rep["latency"][rt]
        assert lat["without_decoding"]["p50_ms"] > 0 and "decoding_overhead" in lat
    assert "## Decoding in the graph" in (out / "report.md").read_text()


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_allow_intents_restricts_every_answer(built, runtime):
    from edgekit.data import load_dataset

    out, _ = built
    p = Predictor.open(out, runtime)
    allow = p.labels["intents"][:2]
    test = load_dataset(DEMO).splits["test"]
    assert {p.predict(ex.text, allow_intents=allow, reject=False)["intent"] for ex in test} <= set(allow)
    assert {p.predict(ex.text, allow_intents=allow)["intent"] for ex in test} <= set(allow) | {"oos"}
    with pytest.raises(ValueError, match="unknown intent"):
        p.predict("hi", allow_intents=["dance"])


def stopped_after(out, n: int) -> None:
    """Make the build in `out` look as if it had stopped after its first n stages."""
    state = json.loads((out / "checkpoints" / "state.json").read_text())
    state["done"], state["rows"], state["records"] = state["done"][:n], state["rows"][:n], state["records"][:n]
    (out / "checkpoints" / "state.json").write_text(json.dumps(state))


def test_resume_skips_completed_stages(built, tiny_bert, tmp_path):
    import shutil

    out = tmp_path / "resumed"
    shutil.copytree(built[0], out)
    stopped_after(out, 1)  # pretend the build stopped after the teacher: resume must not retrain it
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), resume=True, stages=BASIC,
                      train=TrainConfig(epochs=1, lr=0.5, head_lr=0.5))  # would wreck the model if it ran
    rep = build(cfg)
    assert [s["name"] for s in rep["stages"]] == ["teacher", "export", "package"]
    assert rep["stages"][0] == built[1]["stages"][0]
    assert rep["stages"][2]["intent_acc"] == pytest.approx(built[1]["stages"][2]["intent_acc"])


def test_intent_only_csv_build(tmp_path, tiny_bert):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    csv = tmp_path / "intents.csv"
    csv.write_text("query,intent\n" + "".join(f'"{r["text"]}",{r["intent"]}\n' for r in rows))
    out = tmp_path / "pkg"
    rep = build(BuildConfig(data=str(csv), out=str(out), base_model=str(tiny_bert), stages=BASIC,
                            train=TrainConfig(epochs=1, steps_limit=3)))
    assert rep["dataset"]["format"] == "csv" and rep["dataset"]["slot_tags"] == 0
    assert all(s["slot_f1"] is None for s in rep["stages"])
    pkg = Package.load(out)
    assert pkg.manifest["outputs"] == ["intent", "confidence"]
    for rt in ("executorch", "onnx"):
        ans = Predictor.open(pkg, rt).predict("call mom", reject=False)
        assert ans["slots"] == [] and ans["intent"] in pkg.labels["intents"]


def test_quantized_build_and_resume_after_quantize(built, tiny_bert, tmp_path):
    import shutil

    out = tmp_path / "int8"
    shutil.copytree(built[0], out)
    stopped_after(out, 1)
    stages = ["teacher", "quantize", "export", "fuse", "package"]
    cfg = BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), resume=True, stages=stages,
                      quantize={"embedding_bits": 8, "calib_samples": 64, "method": "minmax"})
    rep = build(cfg)
    assert [s["name"] for s in rep["stages"]] == stages
    q = next(p for p in rep["passes"] if p["name"] == "quantize")
    assert rep["quant_layers"] and q["extra"]["quantized_linears"] > 0 and q["bytes_after"] < q["bytes_before"]
    onnx_q = next(p for p in rep["passes"] if p["name"] == "export")["extra"]["onnx"]["extra"]["quantize"]
    assert onnx_q["quantized_matmuls"] > 0 and onnx_q["nodes_after"] > onnx_q["nodes_before"]
    md = (out / "report.md").read_text()
    assert "## Quantization (INT8)" in md and "| fuse (onnx) |" in md and "ExecuTorch p50 / p99 ms" in md
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
    stopped_after(out, 2)  # resume after quantize: the INT8 model is rebuilt from the record (no checkpoint)
    again = build(BuildConfig(**{**cfg.__dict__, "train": TrainConfig(epochs=1, lr=0.5, head_lr=0.5)}))
    assert again["stages"][1] == rep["stages"][1]
    assert again["stages"][2]["intent_acc"] == pytest.approx(rep["stages"][2]["intent_acc"], abs=0.02)
