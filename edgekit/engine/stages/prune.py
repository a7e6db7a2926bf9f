"""Stage `prune`: structured pruning of heads, FFN channels and whole layers, to the profile's parameter target."""

from __future__ import annotations

import time

from edgekit.engine.context import Context
from edgekit.engine.measure import measure
from edgekit.engine.results import PruneResult, stage_row
from edgekit.engine.stages.common import prune_to, target_params


def run(ctx: Context) -> PruneResult:
    t0 = time.perf_counter()
    target, _ = target_params(ctx)
    res = prune_to(ctx, target)
    model, rec, tok = res.model, res.record, ctx.latest("prune").tokenizer
    rec.metrics = measure(ctx, model, tok, "test")
    rec.extra["dev"] = measure(ctx, model, tok, "dev")
    rec.extra["note"] = "before distillation; the accuracy gate for pruning runs after the distill stage"
    rec.seconds = time.perf_counter() - t0
    row = stage_row("prune", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    return PruneResult(rec.to_dict(), row, kept_layers=rec.extra["kept_layers"], target_params=target,
                       _model=model, _tokenizer=tok)
