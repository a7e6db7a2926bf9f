"""Which score separates out-of-scope utterances best, and which dev budget holds on test?

    python examples/oos_scores.py OUT

OUT is a build folder on data with an out-of-scope class (CLINC150). The build's FP32 student (its distill
stage, else the latest model stage) comes from the stage cache through OUT/report.json. For the trained oos class
in the softmax and left out of it, and for each score (raw and temperature-scaled confidence, max logit,
energy), it prints the AUROC (in-scope against out-of-scope) on dev and test, then the test figures of the
threshold chosen on dev at several in-scope accuracy budgets. Figures: docs/experiments.md, 2026-12-01.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from edgekit.data.dataset import load_dataset
from edgekit.engine.cache import built_entry
from edgekit.modeling.model import load_model
from edgekit.modeling.training import collate, featurize
from edgekit.runtime.tokenizer import SentencePieceTokenizer
from edgekit.scoring.confidence import auroc, best_threshold, fit_temperature, operating_point, scores
from edgekit.scoring.score import labels_of


def logits(model, tok, data, split, max_len):
    import torch

    ex = data.splits[split]
    labels = labels_of(data)
    feats = featurize(ex, tok, labels, max_len)
    with torch.no_grad():
        z = np.concatenate([model(*collate(feats, list(range(s, min(s + 256, len(ex)))), tok.pad_id)[:2])[0].numpy()
                            for s in range(0, len(ex), 256)]).astype(np.float64)
    return z, np.array([labels["intents"].index(e.intent) for e in ex])


def main(out: str) -> None:
    found = built_entry(Path(out), ("distill",)) or built_entry(Path(out), ("prune", "trim_vocab", "teacher"))
    if found is None:
        sys.exit(f"{out}: no report.json, or its model was pruned from the stage cache")
    entry, rep = found
    data = load_dataset(rep["dataset"]["source"])
    if data.oos_label is None:
        sys.exit(f"{out}: the data has no out-of-scope class")
    model = load_model(entry / "model.safetensors").eval()
    tok = SentencePieceTokenizer.from_file(entry / "tokenizer.model")
    max_len = rep["dataset"]["lengths"]["max_len"]
    oos = data.intents.index(data.oos_label)
    (zd, yd), (zt, yt) = (logits(model, tok, data, s, max_len) for s in ("dev", "test"))
    t = fit_temperature(zd, yd)
    print(f"model: {entry.parent.name} {entry.name[:12]}; temperature fitted on dev: {t:.3f}")
    for in_softmax in (True, False):
        def view(z, y, temp):
            z = z.copy()
            if not in_softmax:
                z[:, oos] = -1e4
            s = scores(z, temp)
            s["max logit"] = z.max(-1)
            return s, (s["pred"] == y) & (y != oos), s["pred"] == oos, y == oos

        print(f"\noos class {'in' if in_softmax else 'left out of'} the softmax")
        print(f"{'score':22s} {'AUROC dev':>9s} {'AUROC test':>10s}   test in-scope / recall at dev budget "
              "0.5 / 1.0 / 1.5 / 2.0 points")
        for name, temp, key in (("confidence", 1.0, "confidence"), ("confidence, T", t, "confidence"),
                                ("max logit", 1.0, "max logit"), ("energy", 1.0, "energy"), ("energy, T", t, "energy")):
            (sd, okd, pod, isd), (st, okt, pot, ist) = view(zd, yd, temp), view(zt, yt, temp)
            eff_d, eff_t = np.where(pod, -np.inf, sd[key]), np.where(pot, -np.inf, st[key])
            cells = []
            for drop in (0.005, 0.01, 0.015, 0.02):
                tau, _ = best_threshold(sd[key], okd, pod, isd, drop)
                f = operating_point(st[key], okt, pot, ist, -np.inf if tau is None else tau)
                cells.append(f"{100 * f['in_scope_acc']:.1f}/{100 * f['oos_recall']:.1f}")
            print(f"{name:22s} {auroc(eff_d[~isd], eff_d[isd]):9.4f} {auroc(eff_t[~ist], eff_t[ist]):10.4f}   "
                  + "  ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/clinc150-android")
