"""Server graph shapes: one fixed sequence length (`server.seq = "fixed"`) against a dynamic sequence axis (each
batch cut to its own longest utterance, what `server-cpu` ships), and what batching itself buys ONNX Runtime on
this CPU.

Timing does not depend on trained weights, so this uses the pretrained MiniLM with untrained heads of the data's
label counts (no teacher to train): the encoder and heads exported with torch.export, ONNX Runtime's transformer
optimizer, static INT8 as the profile ships it. The in-graph decoding is left out: it runs over the fixed word
count either way, so it adds the same to both.

    python examples/seq_axis.py ../shared/data/snips [--threads 2] [--out build/seq-axis]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from edgekit.converters.fuse import FuseConfig
from edgekit.converters.optimize_onnx import ServerConfig, optimize_onnx
from edgekit.data.dataset import load_dataset
from edgekit.engine.runner import choose_max_len
from edgekit.modeling.pretrained import base_folder, load_pretrained
from edgekit.runtime.backends import cut
from edgekit.text.wordpiece import WordPieceTokenizer


def export(model, path: Path, max_len: int, dynamic_seq: bool) -> None:
    ids = torch.ones(2, max_len, dtype=torch.int64)  # batch 2: a batch of 1 would be specialised
    batch = torch.export.Dim("batch", min=1, max=4096)
    axes = {0: batch, 1: torch.export.Dim("seq", min=3, max=max_len)} if dynamic_seq else {0: batch}
    with torch.no_grad():
        prog = torch.onnx.export(model, (ids, ids.clone()), dynamo=True, opset_version=18, external_data=False,
                                 input_names=["input_ids", "attention_mask"], output_names=["intent", "slots"],
                                 dynamic_shapes=(axes, axes), verbose=False)
    prog.save(str(path))


def batch_inputs(encs, trim: bool) -> list[np.ndarray]:
    ids = np.asarray([e.input_ids for e in encs], dtype=np.int64)  # (B, max_len)
    mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
    return cut([ids, mask]) if trim else [ids, mask]  # the dynamic axis: the batch's longest utterance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="build/seq-axis")
    ap.add_argument("--n", type=int, default=300, help="utterances timed one at a time")
    a = ap.parse_args()
    import onnxruntime as ort

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset(a.data)
    base = base_folder("minilm")
    tok = WordPieceTokenizer.from_file(base / "vocab.txt")
    max_len, stats = choose_max_len(tok, [ex.text for ex in data.splits["train"]], 512)
    model = load_pretrained(base, len(data.intents), len(data.slot_tags)).eval()
    test = [tok.encode(ex.text, max_len) for ex in data.splits["test"]]
    calib = [batch_inputs([tok.encode(ex.text, max_len)], False) for ex in data.splits["train"][:256]]
    check = [batch_inputs([e], False) for e in test[:64]]
    sess, fused = {}, {}
    for name, dyn in (("fixed", False), ("dynamic", True)):
        raw, opt = out / f"{name}.onnx", out / f"{name}.int8.onnx"
        export(model, raw, max_len, dyn)
        # SkipLayerNormalization fused, as when the figures in docs/experiments.md (2026-12-02) were measured
        rec = optimize_onnx(raw, opt, ServerConfig(batch=True, optimize=True, precision="int8"), check, calib,
                            FuseConfig(skip_layer_norm=True))
        fused[name] = rec.extra["fused"]
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
        sess[name] = ort.InferenceSession(str(opt), so, providers=["CPUExecutionProvider"])

    def run(name, x):
        return sess[name].run(None, {"input_ids": x[0], "attention_mask": x[1]})

    # Same answers: the dynamic graph on trimmed batches against the fixed one on full-length batches.
    agree = np.mean([(run("fixed", batch_inputs(test[k:k + 32], False))[0].argmax(-1)
                      == run("dynamic", batch_inputs(test[k:k + 32], True))[0].argmax(-1)).mean()
                     for k in range(0, len(test), 32)])
    res = {"max_len": max_len, "lengths": stats, "threads": a.threads, "fused": fused,
           "intent_agreement": float(agree), "single_p50_ms": {}, "per_s": {}}
    for name in sess:  # warm-up
        for e in test[:20]:
            run(name, batch_inputs([e], name == "dynamic"))
    times = {name: [] for name in sess}
    for i, e in enumerate(test[: a.n]):  # alternating, order swapped every utterance: same machine state
        for name in (list(sess) if i % 2 else list(sess)[::-1]):
            x = batch_inputs([e], name == "dynamic")
            t0 = time.perf_counter()
            run(name, x)
            times[name].append(1000 * (time.perf_counter() - t0))
    res["single_p50_ms"] = {k: round(float(np.percentile(v, 50)), 3) for k, v in times.items()}
    for bs in (1, 4, 8, 32):
        groups = [test[k:k + bs] for k in range(0, len(test) - bs + 1, bs)]
        spent = {name: 0.0 for name in sess}
        for j, g in enumerate(groups):
            for name in (list(sess) if j % 2 else list(sess)[::-1]):
                x = batch_inputs(g, name == "dynamic")
                t0 = time.perf_counter()
                run(name, x)
                spent[name] += time.perf_counter() - t0
        res["per_s"][bs] = {k: round(bs * len(groups) / v, 1) for k, v in spent.items()}
    res["batching_gain_32_over_1"] = {k: round(res["per_s"][32][k] / res["per_s"][1][k], 2) for k in sess}
    (out / "seq_axis.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
