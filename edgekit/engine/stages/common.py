"""Helpers that several stages share. Stages never import each other or the runner: what two stages need lives
here."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np

from edgekit.converters.prune import PruneConfig, prune
from edgekit.engine.context import Context
from edgekit.modeling.model import count_params, embedding_params
from edgekit.modeling.training import collate, featurize, joint_loss
from edgekit.runtime.package import MODEL_FILES


def seed_everything(seed: int) -> None:
    """Seed every generator a stage may draw from, before it creates any module (fresh heads included)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def raw_name(runtime: str) -> str:
    return "raw." + MODEL_FILES[runtime].split(".")[-1]


def model_file(ctx: Context, runtime: str, raw: bool = False) -> Path:
    """The latest artifact of a runtime: fused when the fuse stage made one, else the export's."""
    name = raw_name(runtime) if raw else MODEL_FILES[runtime]
    if ctx.fuse is not None and runtime in ctx.fuse.files:
        return ctx.fuse.dir / name
    return ctx.export.dir / name


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
