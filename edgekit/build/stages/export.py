"""Stage `export`: the model wrapped in the decoding graph, exported for each of the target's runtimes, each
artifact checked against eager and scored on the whole test split through its own runtime.

The raw graph (logits, argmax decoding) is exported beside it, so that plain argmax and constrained decoding
are compared on the same runtime, and so is their latency (package stage); `decoding.compare_argmax = false`
skips it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from edgekit.build.context import Context, ExportResult, stage_row
from edgekit.build.evaluate import calibration, check_inputs, decoding_config, intent_logits, runtime_answers
from edgekit.build.runner import stage
from edgekit.model import count_params
from edgekit.record import PassRecord
from edgekit.report import AGAINST
from edgekit.runtime.decode import OOS
from edgekit.training import agreement, predict_eager, score

log = logging.getLogger("edgekit")
MODEL_FILES = {"executorch": "model.pte", "onnx": "model.onnx"}


def raw_name(runtime: str) -> str:
    return "raw." + MODEL_FILES[runtime].split(".")[-1]


def decoding_graph(ctx: Context, model):
    """The decoding graph for this build: intent whitelist, intent-to-slot whitelist, confidence temperature and
    out-of-scope policy, all calibrated on dev (edgekit.calibration).

    The temperature is one scalar fitted by dev NLL, kept only when it lowers the dev calibration error. With
    out-of-scope examples in dev, each policy (the trained oos class in the softmax or left out of it) and score
    (confidence or energy) gets the threshold that catches the most out-of-scope dev utterances while in-scope
    accuracy loses at most `decoding.oos_max_drop_pts`, and the one with the higher recall is kept; the curve of
    in-scope accuracy against out-of-scope recall on test is recorded with the chosen point. Without them, the
    energy threshold refuses `decoding.oos_far` of the in-scope dev utterances; 0 (the default) turns rejection
    off and out-of-scope recall is unknown."""
    from edgekit.calibration import (
        SCORES,
        auroc,
        best_threshold,
        curve,
        ece,
        fit_temperature,
        operating_point,
        scores,
        threshold_for_rate,
    )
    from edgekit.converters.decoding import NEG, with_decoding

    data, allowed, dset = ctx.data, ctx.cfg.intents, ctx.settings.decoding
    oos, index = data.oos_label, {k: i for i, k in enumerate(data.intents)}

    def split(name):  # utterances the build may answer (its whitelist), their logits, gold ids, oos flags
        exs = [ex for ex in data.splits[name] if allowed is None or ex.intent in allowed or ex.intent == oos]
        return (intent_logits(ctx, model, exs), np.array([index.get(ex.intent, -1) for ex in exs]),
                np.array([ex.intent == oos for ex in exs], bool))

    def view(z, y, is_oos, cfg, t):  # what the graph computes: masked logits / t; right answers; refused by class
        s = scores(np.where(cfg.base_mask().numpy(), z, NEG), t)
        return s, (s["pred"] == y) & ~is_oos, (s["pred"] == cfg.oos_id) if oos else np.zeros(len(y), bool)

    (zd, yd, oos_d), (zt, yt, oos_t) = split("dev"), split("test")
    base = decoding_config(ctx)
    keep = base.base_mask().numpy()[np.clip(yd, 0, None)] & (yd >= 0)  # dev rows whose gold the softmax can answer
    t_fit = fit_temperature(np.where(base.base_mask().numpy(), zd, NEG)[keep], yd[keep])
    err = {}
    for name, t in (("before", 1.0), ("after", t_fit)):
        for sname, (z, y, o) in (("dev", (zd, yd, oos_d)), ("test", (zt, yt, oos_t))):
            s, ok, _ = view(z, y, o, base, t)
            err[f"{sname}_{name}"] = ece(s["confidence"][~o], ok[~o])
    temperature = t_fit if err["dev_after"] < err["dev_before"] else 1.0
    info = {"temperature_fit": t_fit, "calibration_error": err,
            "temperature_note": f"T = {t_fit:.3f} fitted by dev NLL; dev ECE {err['dev_before']:.4f} -> "
                                f"{err['dev_after']:.4f}, so T = {temperature:.3f} is "
                                f"{'kept' if temperature != 1.0 else 'not used'}"}

    if oos_d.any():
        candidates = {}
        for policy, in_softmax in (("oos class + threshold", True), ("threshold on in-scope intents", False)):
            cfg = decoding_config(ctx, oos_in_softmax=in_softmax)
            s, ok, pred_oos = view(zd, yd, oos_d, cfg, temperature)
            for score in SCORES:
                tau, figs = best_threshold(s[score], ok, pred_oos, oos_d, dset.oos_max_drop_pts / 100)
                eff = np.where(pred_oos, -np.inf, s[score])  # answering the oos class refuses whatever the score
                candidates[f"{policy}, {score}"] = {"oos_in_softmax": in_softmax, "score": score, "threshold": tau,
                                                    "dev": figs, "dev_auroc": auroc(eff[~oos_d], eff[oos_d])}
        key = max(candidates, key=lambda k: (candidates[k]["dev"]["oos_recall"], candidates[k]["dev"]["in_scope_acc"]))
        chosen = candidates[key]
        off = chosen["threshold"] is None  # no threshold helps: the oos class alone refuses
        cfg = decoding_config(ctx, oos_in_softmax=chosen["oos_in_softmax"], temperature=temperature,
                              score="confidence" if off else chosen["score"], threshold=0.0 if off else chosen["threshold"])
        s, ok, pred_oos = view(zt, yt, oos_t, cfg, temperature)
        tau = -np.inf if off else cfg.threshold
        info |= {"policy": key, "threshold": cfg.threshold, "candidates": candidates,
                 "calibration": f"dev: {int((~oos_d).sum())} in-scope and {int(oos_d.sum())} out-of-scope "
                                "utterances; the threshold that catches the most out-of-scope utterances while "
                                f"in-scope accuracy loses at most {dset.oos_max_drop_pts:g} points "
                                "(decoding.oos_max_drop_pts)",
                 "oos_curve": {"split": "test", "model": "eager", "score": cfg.score,
                               "auroc": auroc(np.where(pred_oos, -np.inf, s[cfg.score])[~oos_t],
                                              np.where(pred_oos, -np.inf, s[cfg.score])[oos_t]),
                               "points": curve(s[cfg.score], ok, pred_oos, oos_t),
                               "chosen": operating_point(s[cfg.score], ok, pred_oos, oos_t, tau)}}
    else:
        far = dset.oos_far
        s, _, _ = view(zd, yd, oos_d, base, temperature)
        tau = threshold_for_rate(s["energy"], far)
        what = (f"the energy threshold refuses {100 * far:.1f}% of the {len(yd)} held-out in-scope (dev) "
                "utterances (decoding.oos_far)" if tau is not None else "rejection is off (decoding.oos_far = 0): "
                "a threshold cannot be calibrated without out-of-scope examples, and one set from in-scope data "
                "alone refuses valid requests")
        info |= {"policy": "threshold (no out-of-scope data)", "oos_far": far, "oos_recall": "unknown",
                 "calibration": f"no out-of-scope examples: {what}; out-of-scope recall is unknown (it cannot be "
                                "measured on this data)"}
        cfg = decoding_config(ctx, temperature=temperature, **({} if tau is None else
                                                             {"score": "energy", "threshold": tau}))
        info["threshold"] = cfg.threshold
    dm, rec = with_decoding(model, cfg)
    rec.extra.update(info, intent_slot_choice=ctx.teacher.intent_slots_choice)
    return dm, rec


def _onnx_int8(ctx: Context, model, ecfg, path: Path, decoding: bool) -> PassRecord:
    """Export `model` (FP32) to ONNX, then ONNX Runtime's static INT8 (QDQ) with the build's calibration, or 8-bit
    weights with FP32 activations (quantize.onnx_weight_only)."""
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.converters.parity import compare
    from edgekit.converters.quantize_onnx import quantize_onnx
    from edgekit.runtime.backends import OnnxBackend

    fp32_path, checks = path.with_name(path.stem + ".fp32.onnx"), check_inputs(ctx, decoding)
    r = export_onnx(model, ecfg, fp32_path, checks)
    cfg = ctx.settings.quantize
    q = quantize_onnx(fp32_path, path, cfg, calibration(ctx, cfg.calib_samples, decoding))
    fp32_path.unlink()
    r.extra["quantize"] = q.extra
    r.warnings += q.warnings
    r.extra["fp32_bytes"], r.bytes_after = r.bytes_after, q.bytes_after
    # `parity` describes the shipped graph: the quantized one against the FP32 model; the export's own check of
    # the FP32 graph (before quantization) stays beside it
    r.extra["fp32_parity"], r.extra["parity"] = r.extra["parity"], compare(model, OnnxBackend(path).run, checks)
    return r


def onnx_config(ctx: Context):
    """Phones: batch 1. Server graphs: a dynamic batch axis."""
    from edgekit.converters.export_onnx import OnnxExportConfig

    return OnnxExportConfig(ctx.max_len, batch=ctx.settings.server.batch,
                            dynamic_seq=ctx.settings.server.seq == "dynamic")


@stage("export")
def run(ctx: Context) -> ExportResult:
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.metrics import invalid_bio

    t0 = time.perf_counter()
    exporters = {"executorch": (export_executorch, ExecuTorchExportConfig(ctx.max_len, ctx.length_stats["buckets"])),
                 "onnx": (export_onnx, onnx_config(ctx))}
    model, compare = ctx.model, ctx.settings.decoding.compare_argmax  # compare: the raw graph beside it
    decoded, drec = decoding_graph(ctx, model)
    test = ctx.data.splits["test"]
    eager = predict_eager(decoded, test, ctx.tokenizer, ctx.labels, ctx.max_len, reject=False)
    rec = PassRecord("export", params_before=count_params(model), params_after=count_params(model))
    rec.extra["decoding"] = drec.to_dict()["extra"]
    # ONNX Runtime quantizes its own export of the FP32 model: after the quantize stage (static INT8), or with
    # 8-bit weights alone (quantize.onnx_weight_only: the web profile, which has no quantize stage)
    onnx_quantized = ctx.quantize is not None or ctx.settings.quantize.onnx_weight_only
    fp32 = ctx.fp32().model if onnx_quantized else None
    for runtime in ctx.target.runtimes:
        fn, ecfg = exporters[runtime]
        path, raw_path = ctx.work / MODEL_FILES[runtime], ctx.work / raw_name(runtime)
        if runtime == "onnx" and fp32 is not None:
            dm, _ = with_decoding(fp32, config_from_record(ctx.labels, rec.extra["decoding"]))
            r = _onnx_int8(ctx, dm, ecfg, path, True)
            raw = _onnx_int8(ctx, fp32, ecfg, raw_path, False) if compare else None
            # ONNX Runtime quantizes the FP32 model itself: that model is what its graph is checked against
            ref = eager if ctx.quantize is None else predict_eager(dm, test, ctx.tokenizer, ctx.labels, ctx.max_len,
                                                                   reject=False)
            r.extra["against"] = "fp32"
        else:
            r = fn(decoded, ecfg, path, check_inputs(ctx, True))
            raw = fn(model, ecfg, raw_path, check_inputs(ctx, False)) if compare else None
            r.extra["against"], ref = ("int8" if ctx.quantize is not None else "fp32"), eager
        answers = runtime_answers(ctx, runtime, path, True)
        r.metrics = score(test, answers, ctx.labels)
        r.extra["agreement_with_eager"] = agreement(answers, ref)
        shipped = runtime_answers(ctx, runtime, path, True, reject=True)  # as the app gets them by default
        rejecting = score(test, shipped, ctx.labels)
        dec = {}
        if raw is not None:
            raw_answers = runtime_answers(ctx, runtime, raw_path, False)
            r.metrics["slot_f1_argmax"] = score(test, raw_answers, ctx.labels).get("slot_f1")
            dec["argmax"] = {"slot_f1": r.metrics["slot_f1_argmax"],
                             "invalid_bio": invalid_bio([a.get("tags") for a in raw_answers])}
        dec |= {"constrained": {"slot_f1": r.metrics.get("slot_f1"),
                                "invalid_bio": invalid_bio([a.get("tags") for a in answers])},
                "with_rejection": {k: rejecting.get(k) for k in ("intent_acc", "in_scope_acc", "oos_recall")},
                "rejected_share": sum(a["intent"] == (ctx.data.oos_label or OOS) for a in shipped) / len(test)}
        if raw is not None:
            dec |= {"raw_parity": raw.extra["parity"], "raw_bytes": raw.bytes_after,
                    "raw_delegation": {k: raw.extra[k] for k in ("delegated_share", "delegated_compute_ops",
                                                                 "portable_compute_ops") if k in raw.extra}}
        r.extra["decoding"] = dec
        rec.extra[runtime] = r.to_dict()
        rec.warnings += r.warnings
        log.info("%s: %s bytes; against the eager %s model: same answers %.4f, max abs diff %.2e", runtime,
                 r.bytes_after, AGAINST[r.extra["against"]], r.extra["agreement_with_eager"],
                 r.extra["parity"]["max_abs_diff"])
    primary = rec.extra[ctx.target.primary_runtime]
    rec.metrics, rec.bytes_after = primary["metrics"], primary["bytes_after"]
    rec.seconds = time.perf_counter() - t0
    row = stage_row("export", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return ExportResult(rec.to_dict(), row, decoding=rec.extra["decoding"],
                        files={rt: MODEL_FILES[rt] for rt in ctx.target.runtimes})
