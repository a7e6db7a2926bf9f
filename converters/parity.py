"""Check an exported artifact against the eager module on real inputs: max abs diff and argmax agreement."""

from __future__ import annotations

import numpy as np
import torch


def compare(model: torch.nn.Module, run, inputs: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """`run(ids, mask) -> list[np.ndarray]` is the artifact; inputs are (1, T) int64 pairs.

    Slot agreement counts real (unpadded) tokens only; padded positions carry no answer.
    """
    model.eval()
    max_diff, intent_same, tok_same, tok_total = 0.0, 0, 0, 0
    with torch.no_grad():
        for ids, mask in inputs:
            ref = [t.numpy() for t in model(torch.from_numpy(ids), torch.from_numpy(mask))]
            got = run(ids, mask)
            for r, g in zip(ref, got):
                max_diff = max(max_diff, float(np.abs(r - np.asarray(g)).max()))
            intent_same += int(ref[0].argmax(-1)[0] == np.asarray(got[0]).argmax(-1)[0])
            if len(ref) > 1:
                real = mask[0].astype(bool)
                tok_same += int((ref[1][0].argmax(-1) == np.asarray(got[1])[0].argmax(-1))[real].sum())
                tok_total += int(real.sum())
    n = len(inputs)
    return {"n": n, "max_abs_diff": max_diff, "intent_argmax_agree": intent_same / n,
            "slot_argmax_agree": (tok_same / tok_total) if tok_total else None}
