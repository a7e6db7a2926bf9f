"""Stage `fuse`: fixed-shape fusion.

ONNX: ONNX Runtime's offline optimizations saved into the exported graphs (with and without decoding), node
counts before and after, fused against unfused answers on the whole test split; the row scores the fused model.
Server profiles (`server.optimize`): ONNX Runtime's transformer optimizer instead, then `server.precision`
(converters/optimize_onnx.py), with the fused-node counts in the record.
A server precision below FP32 is checked on dev against the unfused graph: one that loses more than
`server.max_loss_pts` (all-mpnet-base-v2 under INT8: a few channels of its activations are tens of times the rest,
more than one scale per tensor can hold) is replaced by the optimizer's FP32 graph, and the report lists both tries.
A lower precision that is kept moves the scores the out-of-scope threshold compares, so the threshold is chosen
again on the kept graph's own dev scores (edgekit.engine.decoding_policy.rethreshold) and written into it.
ExecuTorch fused inside XNNPACK when it was lowered (export stage): its delegated share is carried here.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

from edgekit.converters.optimize_onnx import ServerConfig
from edgekit.engine.context import Context
from edgekit.engine.measure import runtime_answers
from edgekit.engine.results import FuseResult, stage_row
from edgekit.engine.stages.common import raw_name
from edgekit.modeling.model import count_params
from edgekit.record import PassRecord
from edgekit.runtime.package import MODEL_FILES
from edgekit.scoring.score import score


def _fuse(ctx: Context, unfused: Path, dst: Path, decoding: bool, server: ServerConfig) -> dict:
    """`unfused` (the export's copy, kept for the latency columns) -> `dst`, checked on the test split."""
    from edgekit.converters.fuse import fuse_onnx
    from edgekit.converters.optimize_onnx import optimize_onnx
    from edgekit.engine.measure import graph_inputs, quant_inputs

    checks = graph_inputs(ctx, ctx.data.splits["test"], decoding)
    if server.optimize:
        calib = quant_inputs(ctx, ctx.settings.quantize.calib_samples, decoding) if server.precision == "int8" else None
        rec = optimize_onnx(unfused, dst, server, checks, calib, ctx.settings.fuse)
    else:
        rec = fuse_onnx(unfused, dst, checks, ctx.settings.fuse)
    return rec.extra | {"seconds": round(rec.seconds, 2), "warnings": rec.warnings}


def precisions(server: ServerConfig) -> list[str]:
    """The precisions tried in order: the profile's, then FP32 when that one is lower (server profiles only)."""
    return [server.precision] + (["fp32"] if server.precision != "fp32" else [])


METRICS = {"intent_acc": "intent_drop_pts", "slot_f1": "slot_f1_drop_pts"}  # as the gates of the budget name them


def _losses(reference: dict, got: dict) -> dict:
    """Dev points lost against the unfused graph, per metric."""
    return {name: round(100 * (reference[m] - got[m]), 3) for m, name in METRICS.items() if got.get(m) is not None}


def _gated(ctx: Context, src: Path, dst: Path) -> tuple[ServerConfig, dict, list, dict | None]:
    """Fuse the decoding graph. A server precision below FP32 is scored on dev against the unfused graph; past
    `server.max_loss_pts` the optimizer's FP32 graph is tried next. The kept graph ends at `dst`. Returns its
    settings, its record, the tries (none without a lower precision) and the over-limit note (None if one passed)."""
    server, dev = ctx.settings.server, ctx.data.splits["dev"]
    unfused = dst.with_name("unfused." + dst.name)
    shutil.copyfile(src, unfused)
    order = precisions(server)
    if len(order) == 1:
        return server, _fuse(ctx, unfused, dst, True, server), [], None
    reference = score(dev, runtime_answers(ctx, "onnx", unfused, True, split="dev"), ctx.labels)
    limit = {name: server.max_loss_pts for name in METRICS.values()}
    tries, made = [], []
    for i, precision in enumerate(order):
        cfg = dataclasses.replace(server, precision=precision, int8_outputs=server.int8_outputs and precision == "int8")
        path = dst.with_name(f"try{i}.{dst.name}")
        made.append((cfg, _fuse(ctx, unfused, path, True, cfg), path))
        got = score(dev, runtime_answers(ctx, "onnx", path, True, split="dev"), ctx.labels)
        drops = _losses(reference, got)
        ok = all(v <= server.max_loss_pts + 1e-9 for v in drops.values())
        tries.append({"setting": f"precision {precision}", "dev": got, "drops": drops, "budget": limit, "passed": ok})
        if ok:
            break
    best = next((i for i, t in enumerate(tries) if t["passed"]), None)
    over = None
    if best is None:  # not even FP32: the optimizer itself changed the answers
        best = min(range(len(tries)), key=lambda i: max(tries[i]["drops"].values()))
        over = {"stage": "fuse", "message": f"stage fuse: every precision lost more than server.max_loss_pts = "
                f"{server.max_loss_pts} dev points against the unfused graph; kept {tries[best]['setting']}",
                "drops": tries[best]["drops"], "budget": limit}
    cfg, extra, path = made[best]
    path.replace(dst)
    for _, _, other in made:
        other.unlink(missing_ok=True)
    return cfg, extra | {"dev_unfused": reference}, tries, over


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
        server, rec.extra["onnx"], tries, over = _gated(ctx, ctx.export.dir / MODEL_FILES["onnx"],
                                                        ctx.work / MODEL_FILES["onnx"])
        rec.warnings += rec.extra["onnx"].pop("warnings")
        rec.extra["tries"] = tries
        if server.precision != "fp32":
            from edgekit.engine.decoding_policy import rethreshold

            rec.extra["threshold"] = rethreshold(ctx, ctx.work / MODEL_FILES["onnx"], ctx.export.decoding)
        if over:
            rec.extra["over_budget"] = over
            rec.warnings.append(over["message"])
        elif len(tries) > 1:
            rec.warnings.append(f"precision {ctx.settings.server.precision} lost more than server.max_loss_pts = "
                                f"{server.max_loss_pts} dev points ({tries[0]['drops']}); the package ships "
                                f"{server.precision}")
        raw = ctx.export.dir / raw_name("onnx")
        if raw.is_file():  # not with decoding.compare_argmax = false; at the precision the decoding graph kept
            unfused = ctx.work / ("unfused." + raw_name("onnx"))
            shutil.copyfile(raw, unfused)
            rec.extra["onnx_raw"] = _fuse(ctx, unfused, ctx.work / raw_name("onnx"), False, server)
            rec.warnings += rec.extra["onnx_raw"].pop("warnings")
        rec.bytes_before = (ctx.export.dir / MODEL_FILES["onnx"]).stat().st_size
        files["onnx"] = MODEL_FILES["onnx"]
    path = (ctx.work if files else ctx.export.dir) / MODEL_FILES[runtime]
    rec.metrics = score(ctx.data.splits["test"], runtime_answers(ctx, runtime, path, True), ctx.labels)
    rec.bytes_after, rec.seconds = path.stat().st_size, time.perf_counter() - t0
    row = stage_row("fuse", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = runtime
    shipped = {"threshold": rec.extra["threshold"]["after"]} if rec.extra.get("threshold") else {}
    return FuseResult(rec.to_dict(), row, files=files, decoding=shipped)
