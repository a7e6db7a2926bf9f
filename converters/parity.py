"""Check an exported artifact against the eager module on real inputs: max abs diff and answer agreement."""

from __future__ import annotations

import numpy as np
import torch


def compare(model: torch.nn.Module, run, inputs: list[list[np.ndarray]]) -> dict:
    """`run(*arrays) -> list[np.ndarray]` is the artifact; each entry of `inputs` is the graph's input list, the
    first two being input_ids and attention_mask (1, T).

    Raw graphs (logits) are compared by argmax; decoded graphs (integer ids) by equality. Slot agreement counts
    real (unpadded) tokens only; padded positions carry no answer. max_abs_diff covers the float outputs.
    """
    model.eval()
    max_diff, intent_same, tok_same, tok_total = 0.0, 0, 0, 0
    with torch.no_grad():
        for arrays in inputs:
            ref = [t.numpy() for t in model(*(torch.from_numpy(a) for a in arrays))]
            got = [np.asarray(g) for g in run(*arrays)]
            for r, g in zip(ref, got):
                if r.dtype.kind == "f":
                    max_diff = max(max_diff, float(np.abs(r - g).max()))
            decoded = ref[0].dtype.kind in "iu"
            ans = (lambda x: x) if decoded else (lambda x: x.argmax(-1))  # ids, or argmax of logits
            intent_same += int(ans(ref[0]).reshape(-1)[0] == ans(got[0]).reshape(-1)[0])
            slots = 2 if decoded else 1
            if len(ref) > slots:
                real = arrays[1][0].astype(bool)
                tok_same += int((ans(ref[slots])[0] == ans(got[slots])[0])[real].sum())
                tok_total += int(real.sum())
    n = len(inputs)
    return {"n": n, "max_abs_diff": max_diff, "intent_argmax_agree": intent_same / n,
            "slot_argmax_agree": (tok_same / tok_total) if tok_total else None}


def low_agreement(runtime: str, parity: dict, floor: float = 0.995) -> str | None:
    """The exporters' warning when `runtime`'s intent argmax agrees with eager on fewer than `floor` of the check
    inputs (`compare`'s result), else None."""
    if parity["intent_argmax_agree"] >= floor:
        return None
    return (f"{runtime} intent agreement with eager is {parity['intent_argmax_agree']:.4f} on {parity['n']} check "
            "inputs (the report's table: the whole test split)")


def same_answer(ref: list[np.ndarray], got: list[np.ndarray], real: np.ndarray | None = None) -> tuple[bool, float]:
    """Whether two runs of a graph (output lists) give the same answer, and their largest float difference:
    integer outputs (ids) equal, float outputs by argmax (per-piece ones only on the `real` pieces, a (B, T)
    mask, when given)."""
    ok, diff = True, 0.0
    for p, q in zip(ref, got):
        if p.dtype.kind != "f":
            ok &= bool(np.array_equal(p, q))
            continue
        diff = max(diff, float(np.abs(p - q).max()))
        if p.ndim >= 2:
            same = p.argmax(-1) == q.argmax(-1)  # (B,) or (B, T)
            ok &= bool(same[real].all() if real is not None and same.shape == real.shape else same.all())
    return ok, diff


def batch_parity(run, check_inputs: list[list[np.ndarray]], singles: list[list[np.ndarray]] | None = None,
                 batch: int = 32) -> dict:
    """Batched calls (`batch` utterances each) against one call per utterance (`singles`, else run here): the
    share of utterances answered the same (`same_answer`) and the largest float difference."""
    singles = singles if singles is not None else [run(*x) for x in check_inputs]
    same, diff = 0, 0.0
    for k in range(0, len(check_inputs), batch):
        outs = run(*[np.concatenate(a, 0) for a in zip(*check_inputs[k : k + batch])])
        for i, single in enumerate(singles[k : k + batch]):
            ok, d = same_answer([o[i : i + 1] for o in outs], single)
            same, diff = same + ok, max(diff, d)
    return {"n": len(check_inputs), "batch": batch, "agree": same / max(1, len(check_inputs)), "max_abs_diff": diff}


def trim_parity(run, check_inputs: list[list[np.ndarray]]) -> dict:
    """A dynamic sequence axis: each check input cut to its own length (the runtime's `cut`) against the full length. Per-piece
    outputs are compared on the positions both have; the share answered the same and the largest difference."""
    from edgekit.runtime.backends import cut

    same, diff = 0, 0.0
    for x in check_inputs:
        short = cut(x)
        full, got = run(*x), run(*short)
        full = [f[:, : g.shape[1]] if f.ndim == 3 else f for f, g in zip(full, got)]  # (B, T, S) logits
        ok, d = same_answer(full, got, short[1].astype(bool))
        same, diff = same + ok, max(diff, d)
    return {"n": len(check_inputs), "agree": same / max(1, len(check_inputs)), "max_abs_diff": diff}


def merge(per_length: dict[int, dict]) -> dict:
    """One parity figure from `compare` results of several fixed lengths (buckets), kept under "buckets"."""
    parts = list(per_length.values())
    n = sum(p["n"] for p in parts)
    slot = [p for p in parts if p["slot_argmax_agree"] is not None]
    out = {"n": n, "max_abs_diff": max(p["max_abs_diff"] for p in parts),
           "intent_argmax_agree": sum(p["intent_argmax_agree"] * p["n"] for p in parts) / n,
           # weighted by utterances, a close enough stand-in for tokens across buckets
           "slot_argmax_agree": (sum(p["slot_argmax_agree"] * p["n"] for p in slot) / sum(p["n"] for p in slot))
           if slot else None}
    if len(per_length) > 1:
        out["buckets"] = {str(k): v for k, v in per_length.items()}
    return out
