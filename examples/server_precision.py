"""Compare server packages (e.g. FP32, FP16, static and dynamic INT8 builds of one profile) in one process, on
the same test utterances: accuracy, single-utterance p50 (alternating, so all see the same machine state),
throughput at batch 32, and how many answers change when an utterance is answered in a batch of 32.

    python examples/server_precision.py ../shared/data/snips build/scpu build/scpu-int8-dynamic ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgekit.converters.parity import batch_parity
from edgekit.data.dataset import load_dataset
from edgekit.runtime import Predictor
from edgekit.runtime.interface import stack
from edgekit.runtime.predictor import alternating_latency
from edgekit.scoring.score import score


def run(data: str, packages: list[str], n: int = 300) -> list[dict]:
    test = load_dataset(data).splits["test"]
    preds = [Predictor.open(p, "onnx", providers=["cpu"]) for p in packages]
    lat = alternating_latency(preds, [ex.text for ex in test[:n]], rounds=3)
    rows = []
    for path, pred, l in zip(packages, preds, lat):
        m = score(test, [pred.predict(ex.text, warn=False, reject=False) for ex in test], pred.labels)
        xs = [pred.inputs(pred.tokenizer.encode(ex.text, pred.max_len)) for ex in test]
        parity = batch_parity(pred.backend.run, xs)
        groups = [stack(xs[k : k + 32]) for k in range(0, len(xs) - 31, 32)]
        pred.backend.run(*groups[0])
        t0 = time.perf_counter()
        for g in groups:
            pred.backend.run(*g)
        rows.append({"package": path, "intent_acc": round(100 * m["intent_acc"], 2),
                     "slot_f1": round(100 * m["slot_f1"], 2) if m.get("slot_f1") is not None else None,
                     "p50_ms": round(l["p50_ms"], 2), "p99_ms": round(l["p99_ms"], 2),
                     "batch32_per_s": round(32 * len(groups) / (time.perf_counter() - t0), 1),
                     "same_answer_in_batch": round(parity["agree"], 4),
                     "model_bytes": (Path(path) / "model.onnx").stat().st_size})
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("packages", nargs="+")
    ap.add_argument("--n", type=int, default=300, help="test utterances timed one by one")
    args = ap.parse_args()
    for row in run(args.data, args.packages, args.n):
        print(json.dumps(row))
