"""Scoring inside a build: eager models as the package will answer, exported artifacts through their runtimes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.engine.context import Context
from edgekit.modeling.training import predict_eager
from edgekit.scoring.score import score


def decoding_config(ctx: Context, **over):
    """The decoding graph's settings for this build (intent whitelist, intent-to-slot table, oos label)."""
    from edgekit.converters.decoding import DecodingConfig

    table = ctx.teacher.intent_slots if ctx.teacher else None
    table = {k: set(v) for k, v in table.items()} if table is not None else None
    return DecodingConfig(ctx.data.intents, ctx.data.slot_tags, table, ctx.cfg.intents, ctx.data.oos_label, **over)


def measure(ctx: Context, model, tokenizer, split: str) -> dict:
    """Metrics of `model` as the package will answer: with the decoding graph (intent whitelist, BIO Viterbi
    with the intent-slot whitelist), rejection off. slot_f1_argmax: the same model decoded by plain argmax."""
    from edgekit.converters.decoding import with_decoding

    examples = ctx.data.splits[split]
    decoded, _ = with_decoding(model, decoding_config(ctx))
    m = score(examples, predict_eager(decoded, examples, tokenizer, ctx.labels, ctx.max_len, reject=False),
              ctx.labels)
    if m["slot_f1"] is not None:
        argmax = predict_eager(model, examples, tokenizer, ctx.labels, ctx.max_len)
        m["slot_f1_argmax"] = score(examples, argmax, ctx.labels)["slot_f1"]
    return m


def intent_logits(ctx: Context, model, examples, tokenizer=None) -> np.ndarray:
    """(N, I) float64 intent logits of `model` (no decoding graph) at the package's length, in example order.
    tokenizer: the model's (default: the build's)."""
    import torch

    from edgekit.modeling.training import collate, featurize

    tokenizer = tokenizer or ctx.tokenizer
    feats = featurize(examples, tokenizer, ctx.labels, ctx.max_len)
    model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(examples), 256):
            ids, mask, _, _ = collate(feats, list(range(s, min(s + 256, len(examples)))), tokenizer.pad_id)
            out.append(model(ids, mask)[0].double().numpy())
    return np.concatenate(out) if out else np.zeros((0, len(ctx.data.intents)))


def choose_intent_slots(ctx: Context, teacher, tokenizer) -> tuple[dict | None, dict | None]:
    """The intent-to-slot whitelist (slots seen with each intent in train), or None when it does not pay.

    Measured once, with the teacher on dev: the whitelist is kept unless decoding without it gives a higher
    slot F1 (on ATIS, intents whose test utterances carry slots never seen with them in train make it cost
    0.3-0.7 pt). Returns (table with sorted lists, the choice and both figures)."""
    from edgekit.converters.decoding import DecodingConfig, with_decoding

    seen = intent_slots_seen(ctx.data.splits["train"]) if ctx.data.has_slots else None
    if seen is None:
        return None, None
    dev, f1 = ctx.data.splits["dev"], {}
    for key, table in (("with", seen), ("without", None)):
        dm, _ = with_decoding(teacher, DecodingConfig(ctx.data.intents, ctx.data.slot_tags, table, ctx.cfg.intents,
                                                      ctx.data.oos_label))
        answers = predict_eager(dm, dev, tokenizer, ctx.labels, ctx.max_len, reject=False)
        f1[key] = score(dev, answers, ctx.labels)["slot_f1"]
    used = f1["with"] >= f1["without"]
    choice = {"used": used, "teacher_dev_slot_f1_with": f1["with"], "teacher_dev_slot_f1_without": f1["without"]}
    return ({k: sorted(v) for k, v in seen.items()} if used else None), choice


def check_inputs(ctx: Context, decoding: bool, n: int = 64) -> list[list[np.ndarray]]:
    """Real test utterances as graph inputs; decoded graphs also see a restricted intent mask and rejection off."""
    from edgekit.runtime.interface import model_inputs

    encs = [ctx.tokenizer.encode(ex.text, ctx.max_len) for ex in ctx.data.splits["test"][:n]]
    n_int = len(ctx.data.intents)
    some = np.arange(n_int) % 2 == 0  # every other intent allowed
    return [model_inputs(e, n_int, decoding, some if decoding and k % 4 == 3 else None, k % 3 != 2,
                         ctx.settings.server.batch) for k, e in enumerate(encs)]


def runtime_answers(ctx: Context, runtime: str, path: Path, decoding: bool, reject: bool = False,
                    split: str = "test") -> list[dict]:
    """Every utterance of `split` answered by an exported artifact through its runtime, as the Predictor does."""
    from edgekit.runtime.backends import BACKENDS
    from edgekit.runtime.predictor import Predictor

    kw = onnx_options(ctx) if runtime == "onnx" else {}
    p = Predictor(BACKENDS[runtime](path, **kw), ctx.tokenizer, ctx.labels, ctx.max_len, decoding,
                  runtime == "onnx" and ctx.settings.server.batch)
    return [p.predict(ex.text, warn=False, reject=reject) for ex in ctx.data.splits[split]]


def onnx_options(ctx: Context) -> dict:
    """OnnxBackend's options as the package's sessions will run it: inputs cut as the runtime cuts them, the same
    optimizers left out."""
    return {"dynamic_seq": ctx.settings.server.seq == "dynamic",
            "disabled_optimizers": ctx.settings.fuse.disabled_optimizers}


def graph_inputs(ctx: Context, examples, decoding: bool) -> list[list[np.ndarray]]:
    """Each utterance's graph inputs (rejection off, every intent allowed), shaped for the build's graph."""
    from edgekit.runtime.interface import model_inputs

    return [model_inputs(ctx.tokenizer.encode(ex.text, ctx.max_len), len(ctx.data.intents), decoding, reject=False,
                         batched=ctx.settings.server.batch) for ex in examples]


def quant_inputs(ctx: Context, n: int, decoding: bool) -> list[list[np.ndarray]]:
    """Graph inputs for `n` train utterances (a fixed shuffle: every intent is represented)."""
    train = ctx.data.splits["train"]
    idx = np.random.default_rng(ctx.cfg.seed).permutation(len(train))[:n]
    return graph_inputs(ctx, [train[i] for i in idx], decoding)


def argmax_answers(ctx: Context, model, tokenizer) -> list[dict]:
    """Plain argmax answers of an eager model on the test split."""
    return predict_eager(model, ctx.data.splits["test"], tokenizer, ctx.labels, ctx.max_len)


def intent_slots_seen(examples) -> dict[str, set[str]]:
    """The slots observed with each intent in `examples` (the intent-to-slot whitelist)."""
    seen: dict[str, set[str]] = {}
    for ex in examples:
        seen.setdefault(ex.intent, set()).update(t[2:] for t in (ex.tags or []) if t != "O")
    return seen
