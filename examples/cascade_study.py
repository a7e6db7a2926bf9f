"""Which device score lets the cascade escalate for slots: an offline study on a device package and a server package.

Both packages answer dev and test in this process (edgekit.runtime, as shipped). The device's scores come from
its intent confidence (the package's) and from its distilled FP32 student (the build's `distill` stage, from the
stage cache): per word, the top probability of the slot softmax at the word's first piece, over the tags the
predicted intent allows. Scores tried: the intent confidence alone (today's cascade), the weakest word, their
product with the intent confidence, and the product over words (the decoded path's probability if words were
independent). For each, τ is chosen on dev as `edgekit compare` chooses it, on exact match (intent and every tag)
instead of the intent alone: the fewest escalations within `--max-gap` points of the server alone.

    python examples/cascade_study.py DEVICE_PKG SERVER_PKG ../shared/data/snips --set distill.seed=2
"""

from __future__ import annotations

import argparse
import json
import tempfile

import numpy as np


def student(data: str, target: str, sets: list[str]):
    """The build's context and its distilled FP32 student, every stage from the cache (trained when missing)."""
    from edgekit.engine import registry
    from edgekit.engine.config import BuildConfig
    from edgekit.engine.keys import key_of
    from edgekit.engine.runner import prepare, run_stage

    stages = ["teacher", "trim_vocab", "prune", "distill"]
    with tempfile.TemporaryDirectory() as out:
        ctx = prepare(BuildConfig(data=data, out=out, target=target, sets=sets))
    out_key = ctx.input_digest
    for name in stages:
        res = run_stage(ctx, name, key_of(ctx, name, out_key), out_key)
        setattr(ctx, name, res)
        out_key = res.out_key or res.key
        attach = getattr(registry.load(name), "attach", None)
        if attach:
            attach(ctx, res)
    return ctx, ctx.distill.model, ctx.distill.tokenizer


def word_probs(ctx, model, tokenizer, examples, intents: list[int]) -> list[np.ndarray]:
    """Per example, (W,) the top slot probability of each word, over the tags its predicted intent allows."""
    import torch

    from edgekit.converters.decoding import intent_slot_table
    from edgekit.engine.measure import decoding_config

    dc = decoding_config(ctx)
    bias = intent_slot_table(dc.intents, dc.slot_tags, dc.intent_slots, len(dc.intents) + 1).numpy()  # (I+1, S)
    model.eval()
    out = []
    with torch.no_grad():
        for ex, k in zip(examples, intents):
            enc = tokenizer.encode(ex.text, ctx.max_len)
            n = sum(enc.attention_mask)
            logits = model(torch.tensor([enc.input_ids[:n]]), torch.tensor([enc.attention_mask[:n]]))[1][0]
            z = logits.double().numpy() + bias[k]  # (T, S), blocked tags at NEG
            p = np.exp(z - z.max(-1, keepdims=True))
            p = (p / p.sum(-1, keepdims=True)).max(-1)  # (T,)
            first = [pos for pos, w in enumerate(enc.word_index[:n]) if w >= 0]  # each word's first piece
            out.append(p[first] if first else np.ones(1))
    return out


def answers(package: str, examples) -> list[dict]:
    from edgekit.runtime import Package, Predictor

    pkg = Package.load(package)
    pred = Predictor.open(pkg, pkg.manifest["primary_runtime"], threads=1)
    return [pred.predict(ex.text, warn=False) for ex in examples]


def exact(ans: list[dict], examples) -> np.ndarray:
    return np.array([a["intent"] == ex.intent and a.get("tags", ["O"] * len(ex.words)) == (ex.tags or
                     ["O"] * len(ex.words)) for a, ex in zip(ans, examples)])


def main(device: str, server: str, data: str, target: str, sets: list[str], max_gap: float) -> None:
    from edgekit.scoring.score import labels_of, score
    from edgekit.tools.cascade import cascade_curve, choose_threshold

    ctx, model, tok = student(data, target, sets)
    labels, splits = labels_of(ctx.data), ("dev", "test")
    ex = {s: ctx.data.splits[s] for s in splits}
    dev_ans = {s: answers(device, ex[s]) for s in splits}
    srv_ans = {s: answers(server, ex[s]) for s in splits}
    scores = {}
    for s in splits:
        ks = [labels["intents"].index(a["intent"]) if a["intent"] in labels["intents"] else len(labels["intents"])
              for a in dev_ans[s]]
        wp = word_probs(ctx, model, tok, ex[s], ks)
        conf = np.array([a["confidence"] for a in dev_ans[s]])
        weakest = np.array([w.min() for w in wp])
        scores[s] = {"intent": conf, "weakest word": weakest, "intent x weakest word": conf * weakest,
                     "intent x every word": conf * np.array([w.prod() for w in wp])}
    base = {s: score(ex[s], dev_ans[s], labels) for s in splits}
    srv = {s: score(ex[s], srv_ans[s], labels) for s in splits}
    print(f"dev: device {100 * base['dev']['intent_acc']:.2f} / {100 * base['dev']['slot_f1']:.2f}, server "
          f"{100 * srv['dev']['intent_acc']:.2f} / {100 * srv['dev']['slot_f1']:.2f}")
    print(f"device test {100 * base['test']['intent_acc']:.2f} / {100 * base['test']['slot_f1']:.2f}, server "
          f"{100 * srv['test']['intent_acc']:.2f} / {100 * srv['test']['slot_f1']:.2f} (intent / slot F1)")
    ok = {side: {s: exact(a[s], ex[s]) for s in splits} for side, a in (("device", dev_ans), ("server", srv_ans))}
    rows = []
    for name in scores["dev"]:
        curve = cascade_curve(scores["dev"][name], ok["device"]["dev"], ok["server"]["dev"])
        tau = choose_threshold(curve, float(ok["server"]["dev"].mean()), max_gap)["threshold"]
        esc = {s: scores[s][name] < tau for s in splits}
        mixed = {s: [b if e else a for a, b, e in zip(dev_ans[s], srv_ans[s], esc[s])] for s in splits}
        m = {s: score(ex[s], mixed[s], labels) for s in splits}
        rows.append({"score": name, "tau": tau, **{f"{s}_escalation": float(esc[s].mean()) for s in splits},
                     **{f"{s}_intent": m[s]["intent_acc"] for s in splits},
                     **{f"{s}_slot_f1": m[s]["slot_f1"] for s in splits}})
        print(f"{name:24s} τ {tau:.4f} | escalated dev {100 * esc['dev'].mean():5.1f}% test "
              f"{100 * esc['test'].mean():5.1f}% | cascade test {100 * m['test']['intent_acc']:.2f} / "
              f"{100 * m['test']['slot_f1']:.2f} | dev {100 * m['dev']['intent_acc']:.2f} / "
              f"{100 * m['dev']['slot_f1']:.2f}", flush=True)
    # How well each score ranks, whatever τ dev would choose: the test cascade at fixed escalation rates
    for name in scores["test"]:
        cells = []
        for rate in RATES:
            # exactly round(rate * N) utterances, lowest first (a stable sort: ties in order, so every score
            # escalates the same number; a quantile threshold would escalate fewer where scores tie at 1.0)
            esc = np.zeros(len(ex["test"]), bool)
            esc[np.argsort(scores["test"][name], kind="stable")[: round(rate * len(ex["test"]))]] = True
            mixed = [b if e else a for a, b, e in zip(dev_ans["test"], srv_ans["test"], esc)]
            m = score(ex["test"], mixed, labels)
            cells.append(f"{100 * rate:.0f}%: {100 * m['intent_acc']:.2f} / {100 * m['slot_f1']:.2f}")
        print(f"{name:24s} test, lowest scores escalated | " + " | ".join(cells), flush=True)
    print(json.dumps({"device": base, "server": srv, "rows": rows}, default=float))


RATES = (0.02, 0.05, 0.1, 0.2)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("device")
    ap.add_argument("server")
    ap.add_argument("data")
    ap.add_argument("--target", default="android")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--max-gap", type=float, default=0.1,
                    help="points of exact match the cascade may lose (compare's cascade.max_gap_pts default)")
    a = ap.parse_args()
    main(a.device, a.server, a.data, a.target, a.sets, a.max_gap)
