"""ONNX Runtime's 4-bit weights on a built package's student: bytes, accuracy and latency of the ONNX model as the
android build makes it (static INT8 Linears) against MatMulNBits 4-bit Linears (quantize_onnx's OnnxWeights).

    python examples/onnx4bit.py --data ../shared/data/snips --out /tmp/onnx4bit \
        [--cache ~/.cache/edgekit] [--distill KEY] [--export KEY]

It reads a finished build's stage cache, never running a stage: the distill entry's FP32 student and tokenizer,
and the export entry's decoding record. The FP32 decoding graph is exported again (as the export stage does), each
variant quantized and fused (the fuse stage's offline optimization), checked against the eager FP32 model
(converters/parity.py) and scored on dev and test through the Predictor; then the p50 of the model call, one
thread, all variants timed in alternation on the test utterances. One JSON line per variant, a table at the end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

WEB = {"onnx_weight_only": True}  # devices/web.toml's [quantize] difference
# name -> (QuantizeConfig fields over android's [quantize], OnnxWeights fields); "int8" is the android build's graph,
# "web-w8" the web profile's (8-bit blocks, FP32 activations)
VARIANTS = {
    "int8": ({}, {}),
    "w4-b32": ({}, {"linear_bits": 4, "block": 32}),
    "w4-b64": ({}, {"linear_bits": 4, "block": 64}),
    "w4-b128": ({}, {"linear_bits": 4, "block": 128}),
    "w4-b32-fp32math": ({}, {"linear_bits": 4, "block": 32, "accuracy_level": 1}),
    "w4-b32-emb16": ({}, {"linear_bits": 4, "block": 32, "embedding_scales": "fp16"}),
    "int8-emb16": ({}, {"embedding_scales": "fp16"}),
    "web-w8": (WEB, {}),
    "web-w4": (WEB, {"linear_bits": 4, "block": 32}),
    "web-w4-emb16": (WEB, {"linear_bits": 4, "block": 32, "embedding_scales": "fp16"}),
}
T = 24  # the SNIPS android package's length


def entry(cache: Path, stage: str, key: str | None) -> Path:
    """A stage's cache entry: the one named, else the only one (the android build's)."""
    found = [p for p in (cache / stage).iterdir() if p.is_dir() and (key is None or p.name.startswith(key))]
    if len(found) != 1:
        raise SystemExit(f"{cache / stage}: {len(found)} entries match; name one with --{stage}")
    return found[0]


def setup(args):
    """The data, tokenizer, labels, the eager decoded FP32 model, check and calibration inputs (as the build's)."""
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.data.dataset import load_dataset
    from edgekit.modeling.model import load_model
    from edgekit.runtime.interface import model_inputs
    from edgekit.runtime.tokenizer import SentencePieceTokenizer
    from edgekit.scoring.score import labels_of

    cache = Path(args.cache).expanduser()
    dist, exp = entry(cache, "distill", args.distill), entry(cache, "export", args.export)
    data = load_dataset(args.data)
    tok = SentencePieceTokenizer.from_file(dist / "tokenizer.model")
    labels = labels_of(data)
    record = json.loads((exp / "result.json").read_text())["record"]["extra"]["decoding"]
    dm, _ = with_decoding(load_model(dist / "model.safetensors").eval(), config_from_record(labels, record))
    n = len(data.intents)
    some = np.arange(n) % 2 == 0  # measure.check_inputs: every other intent allowed on every 4th, rejection varied
    checks = [model_inputs(tok.encode(ex.text, T), n, True, some if k % 4 == 3 else None, k % 3 != 2)
              for k, ex in enumerate(data.splits["test"][:64])]
    train = data.splits["train"]
    idx = np.random.default_rng(0).permutation(len(train))[:512]  # measure.quant_inputs, seed 0
    calib = [model_inputs(tok.encode(train[i].text, T), n, True, reject=False) for i in idx]
    return data, tok, labels, dm, checks, calib


def make(name: str, fp32: Path, out: Path, dm, checks, calib, test_inputs) -> dict:
    """Quantize `fp32` as `name`, fuse it, check it against eager; the record's figures."""
    from edgekit.converters.fuse import FuseConfig, fuse_onnx
    from edgekit.converters.parity import compare
    from edgekit.converters.quantize_executorch import QuantizeConfig
    from edgekit.converters.quantize_onnx import OnnxWeights, quantize_onnx
    from edgekit.runtime.backends import OnnxBackend

    over, weights = VARIANTS[name]
    cfg = QuantizeConfig(weight4=["*.fc1", "*.fc2", "*.attn.*"], **over)  # android's [quantize] before its 2 MB budget
    q, fused = out / f"{name}.unfused.onnx", out / f"{name}.onnx"
    rec = quantize_onnx(fp32, q, cfg, calib, weights=OnnxWeights(**weights))
    fuse = FuseConfig()
    frec = fuse_onnx(q, fused, test_inputs, fuse)
    parity = compare(dm, OnnxBackend(fused, disabled_optimizers=fuse.disabled_optimizers).run, checks)
    return {"variant": name, "bytes": fused.stat().st_size, "weight4_matmuls": rec.extra["weight4_matmuls"],
            "fused_agreement": frec.extra["agreement"], "parity": parity}


def predictor(path: Path, tok, labels):
    from edgekit.converters.fuse import FuseConfig
    from edgekit.runtime.backends import OnnxBackend
    from edgekit.runtime.predictor import Predictor

    backend = OnnxBackend(path, threads=1, disabled_optimizers=FuseConfig().disabled_optimizers)
    return Predictor(backend, tok, labels, T, decoding=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="~/.cache/edgekit")
    ap.add_argument("--distill")
    ap.add_argument("--export")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-only", action="store_true", help="time the variants already in --out's results.json")
    args = ap.parse_args()

    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
    from edgekit.runtime.interface import model_inputs
    from edgekit.runtime.predictor import alternating_latency
    from edgekit.scoring.score import score

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data, tok, labels, dm, checks, calib = setup(args)
    fp32 = out / "fp32.onnx"
    if not fp32.exists():
        export_onnx(dm, OnnxExportConfig(T), fp32, checks)
    test = data.splits["test"]
    test_inputs = [model_inputs(tok.encode(ex.text, T), len(data.intents), True, reject=False) for ex in test]
    names = args.variants.split(",")
    done = {r["variant"]: r for r in json.loads((out / "results.json").read_text())} if args.time_only else {}
    rows = [done[n] for n in names if n in done]
    for name in names if not args.time_only else []:
        row = make(name, fp32, out, dm, checks, calib, test_inputs)
        p = predictor(out / f"{name}.onnx", tok, labels)
        for split in ("dev", "test"):
            m = score(data.splits[split], [p.predict(ex.text, warn=False, reject=False)
                                          for ex in data.splits[split]], labels)
            row[split] = {k: round(100 * m[k], 2) for k in ("intent_acc", "slot_f1")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    preds = [predictor(out / f"{r['variant']}.onnx", tok, labels) for r in rows]
    lat = alternating_latency(preds, [ex.text for ex in test], rounds=args.rounds)
    print("| variant | model bytes | dev intent / slot F1 | test intent / slot F1 | agree with eager | p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for r, t in zip(rows, lat):
        r["latency"] = t
        print(f"| {r['variant']} | {r['bytes']:,} | {r['dev']['intent_acc']:.2f} / {r['dev']['slot_f1']:.2f} | "
              f"{r['test']['intent_acc']:.2f} / {r['test']['slot_f1']:.2f} | "
              f"{r['parity']['intent_argmax_agree']:.4f} | {t['p50_ms']:.2f} / {t['p99_ms']:.2f} |")
    (out / "results.json").write_text(json.dumps(list((done | {r["variant"]: r for r in rows}).values()), indent=1))


if __name__ == "__main__":
    main()
