"""Refit the graph constants of edgekit/engine/sizes.py: export random-weight students over a grid of shapes and
compare each model.pte with the size model.

    python examples/size_fit.py [--fit] [--cache FILE]

Only the shape and the precisions decide a file's size, so tiny students (hidden 32) stand for any. Each case is
quantized, wrapped in the decoding graph and exported as the build does; the tensor parts of the size model are
exact, so the rest of the file is the program flatbuffer and XNNPACK's graph blobs, which the .pte's own
deserializer separates. Prints each case's error against today's constants; --fit also solves the constants
(least squares) from these cases, PROGRAM_EMB and the per-position Viterbi bytes held as they are. Takes about 15
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

INTENTS = ["a", "b", "c"]
NAMES = ["x", "y", "z"]
TAGS = ["O"] + [f"{p}-{n}" for n in NAMES for p in "BI"]
H, HD = 32, 8
SUBS = ("attn.query", "attn.key", "attn.value", "attn.out", "fc1", "fc2")  # an encoder layer's Linears


def cases() -> list[dict]:
    """Every slot, pooling and transition variant at one layer and one or two lengths; the layer and method terms
    at three layers; then 8-bit embeddings, a factorised table and static INT8 layers."""
    out = []
    variants = ((True, True, True), (True, True, False), (True, False, True), (True, False, False),
                (False, False, False))
    for lengths, (slots, pool, tr) in itertools.product(((16,), (12, 24)), variants):
        out.append(dict(L=1, lengths=lengths, slots=slots, pool=pool, transitions=tr, bits=4, rank=0, int8=()))
    for lengths, (slots, pool, tr) in itertools.product(((16,), (12, 24)), (variants[0], variants[-1])):
        out.append(dict(L=3, lengths=lengths, slots=slots, pool=pool, transitions=tr, bits=4, rank=0, int8=()))
    base = dict(L=2, lengths=(16, 24), slots=True, pool=True, transitions=True, bits=4, rank=0, int8=())
    return out + [base | {"bits": 8}, base | {"rank": 16}, base | {"int8": ("layers.0.fc1",)},
                  base | {"int8": ("layers.0.*", "layers.1.fc2")}]


def export_case(c: dict, path: Path) -> None:
    from edgekit.converters.decoding import DecodingConfig, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.quantize_executorch import QuantizeConfig, calibration_batches, quantize_executorch
    from edgekit.modeling.model import JointModel, ModelConfig, enable_word_pool
    from edgekit.runtime.interface import word_positions

    torch.manual_seed(0)
    T, V = max(c["lengths"]), 300
    model = JointModel(ModelConfig(vocab_size=V, hidden=H, heads=[4, 2, 3, 4][:c["L"]], ffn=[48, 40, 64, 24][:c["L"]],
                                   head_dim=HD, n_intents=len(INTENTS), n_slots=len(TAGS) if c["slots"] else 0,
                                   max_positions=T, emb_rank=c["rank"] or None)).eval()
    with torch.no_grad():  # every tensor distinct, as trained ones are: XNNPACK stores equal tensors once
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    if c["pool"]:
        enable_word_pool(model, [bool(i % 3 == 0) for i in range(V)])
    w4 = ["*.fc1", "*.fc2", "*.attn.*"]
    if c["int8"]:  # these Linears static INT8: left out of weight4 by name
        static = set(int8_names(c))
        w4 = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "head" not in n
              and n not in static]
    q = QuantizeConfig(embedding_bits=c["bits"], weight4=w4, max_fallback=0)
    rng = np.random.default_rng(0)
    enc = []
    for n in range(4, T, 2):
        ids = np.zeros((1, T), np.int64)
        ids[0, :n] = rng.integers(4, V, n)
        mask = (ids != 0).astype(np.int64)
        enc.append((ids, mask, n))
    calib = calibration_batches([[ids, mask] for ids, mask, _ in enc])
    qm, _ = quantize_executorch(model, q, calib)
    tr = None
    if c["transitions"]:
        S = len(TAGS)
        tr = {k: [0.1 * i for i in range(S)] for k in ("start", "unary", "from_b", "from_i")}
    decoded, _ = with_decoding(qm, DecodingConfig(INTENTS, TAGS if c["slots"] else [], None, transitions=tr))
    checks = []
    for ids, mask, n in enc[:3]:
        word_index = [-1] + list(range(n - 2)) + [-1] * (T - n + 1)
        checks.append([ids, mask, word_positions(word_index).reshape(1, -1), np.ones(len(INTENTS), np.int32),
                       np.asarray([0], np.int32)])
    export_executorch(decoded, ExecuTorchExportConfig(T, tuple(b for b in c["lengths"] if b < T)), path, checks)


def measured(path: Path) -> dict:
    """The file's bytes and its XNNPACK blobs (each padded to a segment), read with ExecuTorch's deserializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from edgekit.engine.sizes import SEGMENT, _pad

    prog = deserialize_pte_binary(path.read_bytes()).program
    return {"file": path.stat().st_size, "blobs": sum(_pad(len(b.data), SEGMENT) for b in prog.backend_delegate_data)}


def predicted(c: dict) -> dict:
    from edgekit.engine.sizes import QuantSpec, StudentShape, package_bytes

    heads, ffn = (4, 2, 3, 4)[:c["L"]], (48, 40, 64, 24)[:c["L"]]
    shape = StudentShape(300, heads, ffn, hidden=H, head_dim=HD, emb_rank=c["rank"] or None, word_pool=c["pool"])
    quant = QuantSpec(c["bits"], weight4=("*.fc1", "*.fc2", "*.attn.*"), promoted=tuple(int8_names(c)))
    labels = {"intents": INTENTS, "slot_tags": TAGS if c["slots"] else [], "oos_label": None}
    T = max(c["lengths"])
    got = package_bytes(shape, quant, labels, T, tuple(b for b in c["lengths"] if b < T), None, c["transitions"])
    return got["model.pte"]


def int8_names(c: dict, layer: int | None = None) -> list[str]:
    """The case's static INT8 encoder Linears (all layers, or one), by name."""
    return [n for i in range(c["L"]) if layer in (None, i) for n in (f"layers.{i}.{sub}" for sub in SUBS)
            if any(fnmatch.fnmatch(n, p) for p in c["int8"])]


PROGRAM = ["BASE", "LAYER", "INT8", "RANK", "NO_POOL", "SHARED", "SHARED_LAYER", "K(transitions)", "K(none)"]
BLOBS = ["BASE(slots, pool)", "BASE(slots)", "BASE(no slots)", "LAYER", "RANK", "INT8"]


def program_row(c: dict) -> tuple[list[float], float]:
    """sizes.graph_bytes' program term: the multipliers of the fitted constants, and the bytes of the terms held
    fixed (PROGRAM_EMB, the per-position Viterbi bytes)."""
    from edgekit.engine import sizes

    n, L, s, tr = len(c["lengths"]), c["L"], c["slots"], c["transitions"]
    fixed = n * sizes.PROGRAM_EMB[c["bits"]] + s * sizes.PROGRAM_SLOTS[tr][1] * sum(c["lengths"])
    return [n, n * L, n * len(int8_names(c)), n * bool(c["rank"]), n * s * (not c["pool"]), -(n - 1), -(n - 1) * L,
            n * s * tr, n * s * (not tr)], fixed


def blob_row(c: dict) -> list[float]:
    """sizes.graph_bytes' blobs term: DELEGATE_BASE by (slots, pooling), per layer, rank, static INT8 share."""
    n, key = len(c["lengths"]), (c["slots"], c["pool"])
    share = sum(len(int8_names(c, i)) / len(SUBS) for i in range(c["L"]))
    return [n * (key == (True, True)), n * (key == (True, False)), n * (key == (False, False)), n * c["L"],
            n * bool(c["rank"]), n * share]


def solve(names: list[str], X: list, y: list) -> None:
    X, y = np.array(X, float), np.array(y, float)
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    print({k: round(v) for k, v in zip(names, coef)}, "max residual", round(float(np.abs(X @ coef - y).max())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="solve the program constants from these cases")
    ap.add_argument("--cache", type=Path, help="a JSON file of measured cases, read and extended (a rerun exports "
                    "only what it lacks; delete it after changing the exported graph)")
    args = ap.parse_args()
    rows, seen = [], json.loads(args.cache.read_text()) if args.cache and args.cache.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cases()):
            key = json.dumps(c, sort_keys=True)
            if key not in seen:
                path = Path(tmp) / f"{i}.pte"
                export_case(c, path)
                seen[key] = measured(path)
                if args.cache:
                    args.cache.write_text(json.dumps(seen, indent=1))
            m, p = seen[key], predicted(c)
            exact = sum(p.values()) - p["program"] - p["delegate_graphs"]
            program = m["file"] - exact - m["blobs"]
            rows.append((c, program, m["blobs"]))
            err = sum(p.values()) - m["file"]
            print(f"{i:2d} L={c['L']} lengths={c['lengths']} slots={c['slots']} pool={c['pool']} "
                  f"tr={c['transitions']} bits={c['bits']} rank={c['rank']} int8={c['int8']}: file {m['file']}, "
                  f"program {program} (model {p['program']}), blobs {m['blobs']} (model {p['delegate_graphs']}), "
                  f"error {err:+d}", flush=True)
    if args.fit:
        rows_p = [program_row(c) for c, _, _ in rows]
        print("program:", end=" ")
        solve(PROGRAM, [x for x, _ in rows_p], [prog - fixed for (_, prog, _), (_, fixed) in zip(rows, rows_p)])
        print("blobs:", end=" ")
        solve(BLOBS, [blob_row(c) for c, _, _ in rows], [blobs for _, _, blobs in rows])


if __name__ == "__main__":
    main()
