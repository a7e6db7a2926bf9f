"""Stage `fuse`: fixed-shape fusion.

ONNX: ONNX Runtime's offline optimizations saved into the exported graphs (with and without decoding), node
counts before and after, fused against unfused answers on the whole test split; the row scores the fused model.
Server profiles (`server.optimize`): ONNX Runtime's transformer optimizer instead, then `server.precision`
(converters/optimize_onnx.py), with the fused-node counts in the record.
ExecuTorch fused inside XNNPACK when it was lowered (export stage): its delegated share is carried here.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from edgekit.engine.context import Context
from edgekit.engine.measure import runtime_answers
from edgekit.engine.results import FuseResult, stage_row
from edgekit.engine.stages.common import raw_name
from edgekit.modeling.model import count_params
from edgekit.record import PassRecord
from edgekit.runtime.package import MODEL_FILES
from edgekit.scoring.score import score


def _fuse(ctx: Context, src: Path, dst: Path, decoding: bool) -> dict:
    """`src` (the export, kept as unfused.<name> for the latency columns) -> `dst`, checked on the test split."""
    from edgekit.converters.fuse import fuse_onnx
    from edgekit.converters.optimize_onnx import optimize_onnx
    from edgekit.engine.measure import quant_inputs
    from edgekit.runtime.interface import model_inputs

    n, server = len(ctx.data.intents), ctx.settings.server
    checks = [model_inputs(ctx.tokenizer.encode(ex.text, ctx.max_len), n, decoding, reject=False,
                           batched=server.batch) for ex in ctx.data.splits["test"]]
    unfused = dst.with_name("unfused." + dst.name)
    shutil.copyfile(src, unfused)
    if server.optimize:
        calib = quant_inputs(ctx, ctx.settings.quantize.calib_samples, decoding) if server.precision == "int8" else None
        rec = optimize_onnx(unfused, dst, server, checks, calib, ctx.settings.fuse)
    else:
        rec = fuse_onnx(unfused, dst, checks, ctx.settings.fuse)
    return rec.extra | {"seconds": round(rec.seconds, 2), "warnings": rec.warnings}


def run(ctx: Context) -> FuseResult:
    t0 = time.perf_counter()
    export = ctx.export.record["extra"]
    params = count_params(ctx.fp32().model)
    rec = PassRecord("fuse", params_before=params, params_after=params)
    if "executorch" in export:
        et = export["executorch"]["extra"]
        rec.extra["executorch"] = {k: et[k] for k in ("delegated_share", "delegated_compute_ops",
                                                      "portable_compute_ops", "delegate_calls") if k in et}
        rec.extra["executorch"]["raw_delegation"] = et.get("decoding", {}).get("raw_delegation")
    runtime = "onnx" if "onnx" in ctx.target.runtimes else ctx.target.primary_runtime
    files = {}
    if runtime == "onnx":
        rec.extra["onnx"] = _fuse(ctx, ctx.export.dir / MODEL_FILES["onnx"], ctx.work / MODEL_FILES["onnx"], True)
        rec.warnings += rec.extra["onnx"].pop("warnings")
        if (ctx.export.dir / raw_name("onnx")).is_file():  # not with decoding.compare_argmax = false
            rec.extra["onnx_raw"] = _fuse(ctx, ctx.export.dir / raw_name("onnx"), ctx.work / raw_name("onnx"), False)
            rec.warnings += rec.extra["onnx_raw"].pop("warnings")
        rec.bytes_before = (ctx.export.dir / MODEL_FILES["onnx"]).stat().st_size
        files["onnx"] = MODEL_FILES["onnx"]
    path = (ctx.work if files else ctx.export.dir) / MODEL_FILES[runtime]
    rec.metrics = score(ctx.data.splits["test"], runtime_answers(ctx, runtime, path, True), ctx.labels)
    rec.bytes_after, rec.seconds = path.stat().st_size, time.perf_counter() - t0
    row = stage_row("fuse", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = runtime
    return FuseResult(rec.to_dict(), row, files=files)
