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

from edgekit.engine.context import Context
from edgekit.engine.decoding_policy import decoding_graph
from edgekit.engine.measure import check_inputs, quant_inputs, runtime_answers
from edgekit.engine.results import ExportResult, stage_row
from edgekit.engine.stages.common import raw_name
from edgekit.modeling.model import count_params
from edgekit.modeling.training import predict_eager
from edgekit.record import AGAINST, PassRecord
from edgekit.runtime.decode import OOS
from edgekit.runtime.package import MODEL_FILES
from edgekit.scoring.score import agreement, score

log = logging.getLogger("edgekit")


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
    q = quantize_onnx(fp32_path, path, cfg, quant_inputs(ctx, cfg.calib_samples, decoding), weights=cfg.onnx_weights())
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


def run(ctx: Context) -> ExportResult:
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.scoring.metrics import invalid_bio

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
