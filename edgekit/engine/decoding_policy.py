"""The decoding graph a build ships: intent whitelist, intent-to-slot whitelist, confidence temperature and
out-of-scope policy, all calibrated on dev (edgekit.scoring.confidence).

The temperature is one scalar fitted by dev NLL, kept only when it lowers the dev calibration error. With
out-of-scope examples in dev, each policy (the trained oos class in the softmax or left out of it) and score
(confidence or energy) gets the threshold that catches the most out-of-scope dev utterances while in-scope
accuracy loses at most `decoding.oos_max_drop_pts`, and the one with the higher recall is kept; the curve of
in-scope accuracy against out-of-scope recall on test is recorded with the chosen point. Without them, the
energy threshold refuses `decoding.oos_far` of the in-scope dev utterances; 0 (the default) turns rejection
off and out-of-scope recall is unknown.

A server graph whose precision the fuse stage lowered scores differently from the eager model (all-mpnet-base-v2's
INT8 energies sit lower on CLINC150), so `rethreshold` chooses its threshold again, the same way, on that graph's own
dev scores.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.engine.context import Context
from edgekit.engine.measure import decoding_config, graph_inputs, intent_logits, onnx_options
from edgekit.scoring import confidence as cal

log = logging.getLogger("edgekit")


@dataclass
class Split:
    """The utterances of a split the build may answer (its whitelist): intent logits (N, I), gold ids (N,) (-1:
    not an intent of the build) and out-of-scope flags (N,)."""

    z: np.ndarray
    y: np.ndarray
    oos: np.ndarray


def _examples(ctx: Context, name: str) -> tuple[list, np.ndarray, np.ndarray]:
    """The utterances of a split the build may answer (its whitelist), their gold ids and out-of-scope flags."""
    data, allowed = ctx.data, ctx.cfg.intents
    index = {k: i for i, k in enumerate(data.intents)}
    exs = [ex for ex in data.splits[name] if allowed is None or ex.intent in allowed or ex.intent == data.oos_label]
    return exs, np.array([index.get(ex.intent, -1) for ex in exs]), np.array([ex.intent == data.oos_label
                                                                               for ex in exs], bool)


def _split(ctx: Context, model, name: str, tokenizer=None) -> Split:
    exs, y, oos = _examples(ctx, name)
    return Split(intent_logits(ctx, model, exs, tokenizer), y, oos)


def _view(ctx: Context, d: Split, cfg, t: float):
    """What the graph computes: the scores of masked logits / t; the right answers; the refusals by class."""
    from edgekit.converters.decoding import NEG

    s = cal.scores(np.where(cfg.base_mask().numpy(), d.z, NEG), t)
    refused = (s["pred"] == cfg.oos_id) if ctx.data.oos_label else np.zeros(len(d.y), bool)
    return s, (s["pred"] == d.y) & ~d.oos, refused


def _temperature(ctx: Context, dev: Split, test: Split | None) -> tuple[float, dict]:
    """The temperature fitted on dev, kept only when it lowers dev's calibration error; the figures (test's too,
    unless it is None)."""
    from edgekit.converters.decoding import NEG

    base = decoding_config(ctx)
    keep = base.base_mask().numpy()[np.clip(dev.y, 0, None)] & (dev.y >= 0)  # dev rows whose gold can answer
    t_fit = cal.fit_temperature(np.where(base.base_mask().numpy(), dev.z, NEG)[keep], dev.y[keep])
    err = {}
    for name, t in (("before", 1.0), ("after", t_fit)):
        for sname, d in (("dev", dev), ("test", test)):
            if d is not None:
                s, ok, _ = _view(ctx, d, base, t)
                err[f"{sname}_{name}"] = cal.ece(s["confidence"][~d.oos], ok[~d.oos])
    temperature = t_fit if err["dev_after"] < err["dev_before"] else 1.0
    return temperature, {"temperature_fit": t_fit, "calibration_error": err,
                         "temperature_note": f"T = {t_fit:.3f} fitted by dev NLL; dev ECE {err['dev_before']:.4f} -> "
                                             f"{err['dev_after']:.4f}, so T = {temperature:.3f} is "
                                             f"{'kept' if temperature != 1.0 else 'not used'}"}


def _candidates(ctx: Context, dev: Split, temperature: float) -> dict:
    """Each policy and score with its best dev threshold and figures."""
    out, max_drop = {}, ctx.settings.decoding.oos_max_drop_pts / 100
    for policy, in_softmax in (("oos class + threshold", True), ("threshold on in-scope intents", False)):
        s, ok, pred_oos = _view(ctx, dev, decoding_config(ctx, oos_in_softmax=in_softmax), temperature)
        for score in cal.SCORES:
            tau, figs = cal.best_threshold(s[score], ok, pred_oos, dev.oos, max_drop)
            eff = np.where(pred_oos, -np.inf, s[score])  # answering the oos class refuses whatever the score
            out[f"{policy}, {score}"] = {"oos_in_softmax": in_softmax, "score": score, "threshold": tau,
                                         "dev": figs, "dev_auroc": cal.auroc(eff[~dev.oos], eff[dev.oos])}
    return out


def _best(candidates: dict) -> str:
    """The policy with the higher dev recall within the accuracy budget, then the higher in-scope accuracy."""
    return max(candidates, key=lambda k: (candidates[k]["dev"]["oos_recall"], candidates[k]["dev"]["in_scope_acc"]))


def shipped_dev(ctx: Context, model, tokenizer=None) -> dict | None:
    """Dev as the package answers it, rejection on: the policy, temperature and threshold the export stage would
    choose on `model`'s own dev scores, and their figures. `intent_acc` counts an out-of-scope utterance right when
    it is refused and an in-scope one when it is right and not refused. None without out-of-scope dev utterances.

    The gates compare these (edgekit.engine.gating): with rejection off, dev's out-of-scope utterances would count
    only when the argmax answers the out-of-scope class, which the package does not rely on (CLINC150's 2 MB
    students: 30 of dev's 100 that way, 88-90 with the threshold)."""
    dev = _split(ctx, model, "dev", tokenizer)
    if not dev.oos.any():
        return None
    temperature, _ = _temperature(ctx, dev, None)
    candidates = _candidates(ctx, dev, temperature)
    figs = candidates[_best(candidates)]["dev"]
    n_in, n_oos = int((~dev.oos).sum()), int(dev.oos.sum())
    return {"intent_acc": (figs["in_scope_acc"] * n_in + figs["oos_recall"] * n_oos) / (n_in + n_oos),
            "in_scope_acc": figs["in_scope_acc"], "oos_recall": figs["oos_recall"],
            "oos_max_drop_pts": ctx.settings.decoding.oos_max_drop_pts}


def with_rejection(ctx: Context, dev: dict, model, tokenizer) -> dict:
    """`dev` (measure's dev metrics of `model`) with `rejecting` (`shipped_dev`) added where dev has out-of-scope
    utterances, unless it has them under this `decoding.oos_max_drop_pts` already (a try or teacher from the
    cache). What the gates compare (edgekit.engine.gating)."""
    stale = dev.get("rejecting", {}).get("oos_max_drop_pts") != ctx.settings.decoding.oos_max_drop_pts
    if stale and ctx.data.oos_label is not None:
        got = shipped_dev(ctx, model, tokenizer)
        if got is not None:
            dev["rejecting"] = got
    return dev


def _with_oos_data(ctx: Context, dev: Split, test: Split, temperature: float):
    """Out-of-scope examples in dev: the policy with the higher dev recall within the accuracy budget."""
    candidates = _candidates(ctx, dev, temperature)
    key = _best(candidates)
    chosen = candidates[key]
    off = chosen["threshold"] is None  # no threshold helps: the oos class alone refuses
    cfg = decoding_config(ctx, oos_in_softmax=chosen["oos_in_softmax"], temperature=temperature,
                          score="confidence" if off else chosen["score"], threshold=0.0 if off else chosen["threshold"])
    s, ok, pred_oos = _view(ctx, test, cfg, temperature)
    tau, eff = -np.inf if off else cfg.threshold, np.where(pred_oos, -np.inf, s[cfg.score])
    info = {"policy": key, "threshold": cfg.threshold, "candidates": candidates,
            "calibration": f"dev: {int((~dev.oos).sum())} in-scope and {int(dev.oos.sum())} out-of-scope "
                           "utterances; the threshold that catches the most out-of-scope utterances while "
                           f"in-scope accuracy loses at most {ctx.settings.decoding.oos_max_drop_pts:g} points "
                           "(decoding.oos_max_drop_pts)",
            "oos_curve": {"split": "test", "model": "eager", "score": cfg.score,
                          "auroc": cal.auroc(eff[~test.oos], eff[test.oos]),
                          "points": cal.curve(s[cfg.score], ok, pred_oos, test.oos),
                          "chosen": cal.operating_point(s[cfg.score], ok, pred_oos, test.oos, tau)}}
    return cfg, info


def _without_oos_data(ctx: Context, dev: Split, temperature: float):
    """No out-of-scope examples: the energy threshold refusing `decoding.oos_far` of dev, or no rejection."""
    far = ctx.settings.decoding.oos_far
    s, _, _ = _view(ctx, dev, decoding_config(ctx), temperature)
    tau = cal.threshold_for_rate(s["energy"], far)
    what = (f"the energy threshold refuses {100 * far:.1f}% of the {len(dev.y)} held-out in-scope (dev) "
            "utterances (decoding.oos_far)" if tau is not None else "rejection is off (decoding.oos_far = 0): "
            "a threshold cannot be calibrated without out-of-scope examples, and one set from in-scope data "
            "alone refuses valid requests")
    cfg = decoding_config(ctx, temperature=temperature, **({} if tau is None else {"score": "energy", "threshold": tau}))
    return cfg, {"policy": "threshold (no out-of-scope data)", "oos_far": far, "oos_recall": "unknown",
                 "calibration": f"no out-of-scope examples: {what}; out-of-scope recall is unknown (it cannot be "
                                "measured on this data)", "threshold": cfg.threshold}


def decoding_graph(ctx: Context, model):
    """`model` with this build's decoding graph, and its record (the policy, the threshold, the figures)."""
    from edgekit.converters.decoding import with_decoding

    dev, test = _split(ctx, model, "dev"), _split(ctx, model, "test")
    temperature, info = _temperature(ctx, dev, test)
    cfg, more = _with_oos_data(ctx, dev, test, temperature) if dev.oos.any() else \
        _without_oos_data(ctx, dev, temperature)
    fit = _transitions(ctx, cfg) if ctx.data.slot_tags and ctx.settings.decoding.transitions else None
    if fit is not None:
        cfg = dataclasses.replace(cfg, transitions=fit.extra.pop("transitions"))
    dm, rec = with_decoding(model, cfg)
    rec.extra.update(info | more, intent_slot_choice=ctx.teacher.intent_slots_choice,
                     transitions_fit=fit.extra | {"seconds": fit.seconds} if fit is not None else None)
    return dm, rec


def _transitions(ctx: Context, cfg):
    """Transition scores fitted on train over the FP32 model's slot scores (the INT8 model's differ little and cost
    more to run), under the same intent-to-slot table; their record."""
    from edgekit.converters.decoding import intent_slot_table
    from edgekit.converters.transitions import TransitionConfig, TransitionInputs, fit_transitions

    s = ctx.settings.decoding
    fp32 = ctx.fp32()
    allow = intent_slot_table(cfg.intents, cfg.slot_tags, cfg.intent_slots, len(cfg.intents) + 1)
    inputs = TransitionInputs(fp32.tokenizer, ctx.data.splits["train"], ctx.labels, ctx.max_len, allow)
    rec = fit_transitions(fp32.model, inputs, TransitionConfig(s.transition_epochs, s.transition_l2)).record
    log.info("transitions: train NLL %.4f -> %.4f over %d utterances, %.1fs", rec.extra["train_nll_before"],
             rec.extra["train_nll_after"], rec.extra["utterances"], rec.seconds)
    return rec


def rethreshold(ctx: Context, path: Path, decoding: dict) -> dict | None:
    """The out-of-scope threshold of the ONNX decoding graph at `path` chosen again on that graph's own dev scores,
    under the policy and score the export stage chose and the same budget (`decoding.oos_max_drop_pts`, or
    `decoding.oos_far` without out-of-scope data), and written into the graph. For a graph whose precision the fuse
    stage lowered, which moves its scores. Returns the record (threshold and dev figures before and after), or None
    when the graph refuses nothing."""
    from edgekit.converters.oos_threshold import set_threshold, with_score_output

    old = decoding.get("threshold") or 0.0
    if decoding.get("score", "confidence") == "confidence" and old == 0.0:  # rejection is off
        return None
    t0 = time.perf_counter()
    exs, y, oos = _examples(ctx, "dev")
    tapped = path.with_name("scored." + path.name)
    with_score_output(path, tapped, old)
    try:
        pred, s = _graph_scores(ctx, tapped, exs)
    finally:
        tapped.unlink(missing_ok=True)
    ok, refused = (pred == y) & ~oos, (pred == decoding["oos_id"]) if ctx.data.oos_label else np.zeros(len(y), bool)
    d = ctx.settings.decoding
    if oos.any():
        # never None with out-of-scope data: the lowest score refuses nothing beyond the class, within any budget
        new, _ = cal.best_threshold(s, ok, refused, oos, d.oos_max_drop_pts / 100)
    else:
        new = cal.threshold_for_rate(s, d.oos_far)
    before, after = (cal.operating_point(s, ok, refused, oos, t) for t in (old, new))
    set_threshold(path, old, new)
    log.info("out-of-scope threshold on the shipped graph's dev %s: %.4f -> %.4f; dev in-scope %.4f -> %.4f, "
             "refused in scope %.4f -> %.4f", decoding["score"], old, new, before["in_scope_acc"],
             after["in_scope_acc"], before["refused_in_scope"], after["refused_in_scope"])
    return {"score": decoding["score"], "before": old, "after": new, "dev_before": before, "dev_after": after,
            "utterances": len(y), "seconds": round(time.perf_counter() - t0, 2)}


def _graph_scores(ctx: Context, path: Path, exs: list) -> tuple[np.ndarray, np.ndarray]:
    """(intent ids before rejection (N,), the scores the threshold compares (N,)) of the tapped graph at `path`
    (converters/oos_threshold.py), 64 utterances a call on a batched graph whose answers do not depend on their
    batch (fuse checks that: `batch_parity`), one at a time on a dynamic INT8 one (its scales come from the batch)."""
    from edgekit.runtime.backends import OnnxBackend
    from edgekit.runtime.interface import stack

    server = ctx.settings.server
    backend, rows = OnnxBackend(path, **onnx_options(ctx)), graph_inputs(ctx, exs, True)
    step = 64 if server.batch and not (server.precision == "int8" and server.int8 == "dynamic") else 1
    outs = [backend.run(*stack(rows[i : i + step])) if server.batch else backend.run(*rows[i])
            for i in range(0, len(rows), step)]
    return np.concatenate([o[0].reshape(-1) for o in outs]), np.concatenate([o[-1].reshape(-1) for o in outs])
