"""Stage `quantize`: INT8 for XNNPACK (PT2E, calibrated, 4/8-bit embeddings), with FP32 fallback of the most
sensitive layers while dev drops more than the [quantize] budget against the FP32 model.

ONNX Runtime's own INT8 pass (quantize_onnx) runs on the exported ONNX graph in the export stage, with the same
calibration; it has no accuracy gate of its own (its test accuracy is in the export record).
"""

from __future__ import annotations

import dataclasses
import logging

from edgekit.engine.context import Context
from edgekit.engine.measure import measure, quant_inputs
from edgekit.engine.results import QuantizeResult, stage_row
from edgekit.modeling.model import count_params

log = logging.getLogger("edgekit")


def quantized(ctx: Context, cfg, evaluate_fn=None, say=log.info):
    """(INT8 model, PassRecord) of the FP32 model before this stage, calibrated on train utterances."""
    from edgekit.converters.quantize_executorch import calibration_batches, quantize_executorch

    calib = calibration_batches(quant_inputs(ctx, cfg.calib_samples, False))
    return quantize_executorch(ctx.fp32().model, cfg, calib, evaluate_fn, log=say)


def rebuild(ctx: Context, res: QuantizeResult):
    """The same INT8 model again, from the recorded layer choices (the cache keeps no quantized module)."""
    cfg = dataclasses.replace(ctx.settings.quantize, keep_fp32=res.fp32_layers, weight4=res.weight4_layers,
                              max_fallback=0)
    log.info("quantize: the INT8 model rebuilt from the cache entry's layer choices (%d FP32)", len(res.fp32_layers))
    return quantized(ctx, cfg, say=lambda s: None)[0]


def run(ctx: Context) -> QuantizeResult:
    fp32 = ctx.fp32()
    q, rec = quantized(ctx, ctx.settings.quantize, lambda m: measure(ctx, m, fp32.tokenizer, "dev"))
    rec.metrics = measure(ctx, q, fp32.tokenizer, "test")
    rec.params_after = count_params(fp32.model)
    row = stage_row("quantize", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    return QuantizeResult(rec.to_dict(), row, fp32_layers=[f["layer"] for f in rec.extra["fp32_layers"]],
                          weight4_layers=rec.extra.get("weight4_layers", []), _model=q, _tokenizer=fp32.tokenizer)


def attach(ctx: Context, res: QuantizeResult) -> None:
    """A reused entry: its model is rebuilt only if a later stage asks for it."""
    res._loader = lambda: rebuild(ctx, res)
