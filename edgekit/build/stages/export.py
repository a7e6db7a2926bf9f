"""Stage `export`: the model wrapped in the decoding graph, exported for each of the target's runtimes, each
artifact checked against eager and scored on the whole test split through its own runtime.

The raw graph (logits, argmax decoding) is exported beside it, so that plain argmax and constrained decoding
are compared on the same runtime, and so is their latency (package stage).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from edgekit.build.context import Context, ExportResult, stage_row
from edgekit.build.evaluate import calibration, check_inputs, decoding_config, runtime_answers
from edgekit.build.runner import stage
from edgekit.model import count_params
from edgekit.record import PassRecord
from edgekit.runtime.decode import OOS
from edgekit.training import agreement, predict_eager, score

log = logging.getLogger("edgekit")
MODEL_FILES = {"executorch": "model.pte", "onnx": "model.onnx"}


def raw_name(runtime: str) -> str:
    return "raw." + MODEL_FILES[runtime].split(".")[-1]


def decoding_graph(ctx: Context, model):
    """The decoding graph for this build: intent whitelist, intent-to-slot whitelist, out-of-scope policy.

    With out-of-scope examples in dev, two policies are calibrated there (each: the most out-of-scope recall
    with in-scope accuracy at most 2 points under no threshold) and the one with the higher recall kept: the
    trained oos class plus a confidence threshold, or a threshold on the in-scope intents alone (oos class left
    out of the softmax). Without them, the threshold refuses `decoding.oos_far` of the held-out in-scope (dev)
    utterances; 0 (the default) turns rejection off."""
    from edgekit.converters.decoding import best_threshold, threshold_for_rate, with_decoding

    data, allowed = ctx.data, ctx.cfg.intents
    oos = data.oos_label
    dev = [ex for ex in data.splits["dev"] if allowed is None or ex.intent in allowed or ex.intent == oos]
    is_oos = np.array([ex.intent == oos for ex in dev]) if oos else np.zeros(len(dev), bool)

    def answers(cfg):  # eager answers of the decoding graph without rejection
        dm, _ = with_decoding(model, cfg)
        return predict_eager(dm, dev, ctx.tokenizer, ctx.labels, ctx.max_len, reject=False)

    if is_oos.any():
        candidates = {}
        for policy, in_softmax in (("oos class + threshold", True), ("threshold on in-scope intents", False)):
            ans = answers(decoding_config(ctx, oos_in_softmax=in_softmax))
            conf = np.array([a["confidence"] for a in ans])
            ok = np.array([a["intent"] == ex.intent for a, ex in zip(ans, dev)])
            tau, figs = best_threshold(conf, ok, is_oos, np.array([a["intent"] == oos for a in ans]))
            candidates[policy] = {"oos_in_softmax": in_softmax, "threshold": tau, "dev": figs}
        policy = max(candidates, key=lambda k: (candidates[k]["dev"]["oos_recall"], candidates[k]["dev"]["in_scope_acc"]))
        chosen = candidates[policy]
        info = {"policy": policy, "threshold": chosen["threshold"], "candidates": candidates,
                "calibration": f"dev: {int((~is_oos).sum())} in-scope and {int(is_oos.sum())} out-of-scope "
                               "utterances; the threshold that catches the most out-of-scope utterances while "
                               "in-scope accuracy stays within 2 points of its value without one"}
        cfg = decoding_config(ctx, oos_in_softmax=chosen["oos_in_softmax"], threshold=chosen["threshold"])
    else:
        far = ctx.settings.decoding.oos_far
        tau = threshold_for_rate(np.array([a["confidence"] for a in answers(decoding_config(ctx))]), far) \
            if far > 0 else 0.0
        what = (f"the threshold refuses {100 * far:.1f}% of the {len(dev)} held-out in-scope (dev) utterances "
                "(decoding.oos_far)" if far > 0 else "rejection is off (decoding.oos_far = 0): a threshold cannot "
                "be calibrated without out-of-scope examples, and one set from in-scope data alone refuses valid "
                "requests")
        info = {"policy": "threshold (no out-of-scope data)", "threshold": tau, "oos_far": far,
                "oos_recall": "unknown", "calibration": f"no out-of-scope examples: {what}; out-of-scope recall "
                                                         "is unknown (it cannot be measured on this data)"}
        cfg = decoding_config(ctx, threshold=tau)
    dm, rec = with_decoding(model, cfg)
    rec.extra.update(info, intent_slot_choice=ctx.teacher.intent_slots_choice)
    return dm, rec


def _onnx_int8(ctx: Context, model, ecfg, path: Path, decoding: bool) -> PassRecord:
    """Export `model` (FP32) to ONNX, then ONNX Runtime's static INT8 (QDQ) with the build's calibration."""
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.converters.quantize_onnx import quantize_onnx

    fp32_path = path.with_name(path.stem + ".fp32.onnx")
    r = export_onnx(model, ecfg, fp32_path, check_inputs(ctx, decoding))
    cfg = ctx.settings.quantize
    q = quantize_onnx(fp32_path, path, cfg, calibration(ctx, cfg.calib_samples, decoding))
    fp32_path.unlink()
    r.extra["quantize"] = q.extra
    r.warnings += q.warnings
    r.extra["fp32_bytes"], r.bytes_after = r.bytes_after, q.bytes_after
    return r


def onnx_config(ctx: Context):
    """Phones: batch 1. Server graphs: a dynamic batch axis."""
    from edgekit.converters.export_onnx import OnnxExportConfig

    return OnnxExportConfig(ctx.max_len, batch=ctx.settings.server.batch)


@stage("export")
def run(ctx: Context) -> ExportResult:
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.metrics import invalid_bio

    t0 = time.perf_counter()
    exporters = {"executorch": (export_executorch, ExecuTorchExportConfig(ctx.max_len, ctx.length_stats["buckets"])),
                 "onnx": (export_onnx, onnx_config(ctx))}
    model = ctx.model
    decoded, drec = decoding_graph(ctx, model)
    test = ctx.data.splits["test"]
    eager = predict_eager(decoded, test, ctx.tokenizer, ctx.labels, ctx.max_len, reject=False)
    rec = PassRecord("export", params_before=count_params(model), params_after=count_params(model))
    rec.extra["decoding"] = drec.to_dict()["extra"]
    fp32 = ctx.fp32().model if ctx.quantize is not None else None  # ONNX Runtime quantizes its own export
    for runtime in ctx.target.runtimes:
        fn, ecfg = exporters[runtime]
        path, raw_path = ctx.work / MODEL_FILES[runtime], ctx.work / raw_name(runtime)
        if runtime == "onnx" and fp32 is not None:
            dm, _ = with_decoding(fp32, config_from_record(ctx.labels, rec.extra["decoding"]))
            r = _onnx_int8(ctx, dm, ecfg, path, True)
            raw = _onnx_int8(ctx, fp32, ecfg, raw_path, False)
        else:
            r = fn(decoded, ecfg, path, check_inputs(ctx, True))
            raw = fn(model, ecfg, raw_path, check_inputs(ctx, False))
        answers = runtime_answers(ctx, runtime, path, True)
        r.metrics = score(test, answers, ctx.labels)
        r.extra["agreement_with_eager"] = agreement(answers, eager)
        raw_answers = runtime_answers(ctx, runtime, raw_path, False)
        shipped = runtime_answers(ctx, runtime, path, True, reject=True)  # as the app gets them by default
        rejecting = score(test, shipped, ctx.labels)
        r.metrics["slot_f1_argmax"] = score(test, raw_answers, ctx.labels).get("slot_f1")
        r.extra["decoding"] = {
            "argmax": {"slot_f1": r.metrics["slot_f1_argmax"],
                       "invalid_bio": invalid_bio([a.get("tags") for a in raw_answers])},
            "constrained": {"slot_f1": r.metrics.get("slot_f1"),
                            "invalid_bio": invalid_bio([a.get("tags") for a in answers])},
            "with_rejection": {k: rejecting.get(k) for k in ("intent_acc", "in_scope_acc", "oos_recall")},
            "rejected_share": sum(a["intent"] == (ctx.data.oos_label or OOS) for a in shipped) / len(test),
            "raw_parity": raw.extra["parity"], "raw_bytes": raw.bytes_after,
            "raw_delegation": {k: raw.extra[k] for k in ("delegated_share", "delegated_compute_ops",
                                                         "portable_compute_ops") if k in raw.extra}}
        rec.extra[runtime] = r.to_dict()
        rec.warnings += r.warnings
        log.info("%s: %s bytes, agreement with eager %.4f, max abs diff %.2e", runtime, r.bytes_after,
                 r.extra["agreement_with_eager"], r.extra["parity"]["max_abs_diff"])
    primary = rec.extra[ctx.target.primary_runtime]
    rec.metrics, rec.bytes_after = primary["metrics"], primary["bytes_after"]
    rec.seconds = time.perf_counter() - t0
    row = stage_row("export", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return ExportResult(rec.to_dict(), row, decoding=rec.extra["decoding"],
                        files={rt: MODEL_FILES[rt] for rt in ctx.target.runtimes})
