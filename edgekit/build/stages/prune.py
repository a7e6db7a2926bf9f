"""Stage `prune`: structured pruning of heads, FFN channels and whole layers, to the profile's parameter target."""

from __future__ import annotations

import copy
import random
import time

from edgekit.build.context import Context, PruneResult, stage_row
from edgekit.build.evaluate import evaluate
from edgekit.build.runner import stage
from edgekit.converters.prune import PruneConfig, prune
from edgekit.model import count_params, embedding_params
from edgekit.training import collate, featurize, joint_loss


def target_params(ctx: Context, scale: float = 1.0) -> tuple[int, int]:
    """Non-embedding parameters the student may keep: the profile's share of the teacher's, and no more than
    the total share leaves after the (trimmed) embeddings, times `scale` (a gate's back-off). Returns
    (target, cap): the cap is the same under the back-off caps max_param_share / max_total_share."""
    c, teacher, trimmed = ctx.settings.compress, ctx.teacher.model, ctx.latest("prune").model

    def limit(share, total_share):
        return int(min(share * count_params(teacher, embeddings=False),
                       total_share * count_params(teacher) - embedding_params(trimmed)))

    cap = limit(c.max_param_share or c.param_share, c.max_total_share or c.total_share)
    return min(cap, int(limit(c.param_share, c.total_share) * scale)), cap


def prune_to(ctx: Context, target: int):
    """Prune the stage's input model (a copy) to `target` non-embedding parameters; returns the PassResult."""
    source = ctx.latest("prune")
    train = ctx.data.splits["train"]
    rng = random.Random(ctx.cfg.seed)
    sample = rng.sample(train, min(len(train), ctx.settings.compress.prune_samples))
    # The student's position table is cut to the package length (trim_vocab): it trains on what it will see.
    feats = featurize(sample, source.tokenizer, ctx.labels, ctx.max_len)
    batches = [collate(feats, list(range(i, min(i + 32, len(sample)))), source.tokenizer.pad_id)
               for i in range(0, len(sample), 32)]
    cfg = PruneConfig(target_params=target, drop_layers=ctx.settings.compress.prune_layers)
    return prune(copy.deepcopy(source.model), batches, lambda out, i, s: joint_loss(out, i, s, 1.0), cfg)


@stage("prune")
def run(ctx: Context) -> PruneResult:
    t0 = time.perf_counter()
    target, _ = target_params(ctx)
    res = prune_to(ctx, target)
    model, rec, tok = res.model, res.record, ctx.latest("prune").tokenizer
    rec.metrics = evaluate(ctx, model, tok, "test")
    rec.extra["dev"] = evaluate(ctx, model, tok, "dev")
    rec.extra["note"] = "before distillation; the accuracy gate for pruning runs after the distill stage"
    rec.seconds = time.perf_counter() - t0
    row = stage_row("prune", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    return PruneResult(rec.to_dict(), row, kept_layers=rec.extra["kept_layers"], target_params=target,
                       _model=model, _tokenizer=tok)
