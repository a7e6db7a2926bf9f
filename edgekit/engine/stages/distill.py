"""Stage `distill`: the pruned student learns from the teacher; gate on dev; on a miss, prune less and distil again.

Each try (the pruned size and the distilled student) is its own cache entry, so a rerun with a looser budget or
more retries starts from the tries already made.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import shutil
import time

from edgekit.converters.distill import DistillInputs, distill, pack_targets, uniform_layers, unpack_targets
from edgekit.engine.cache import stage_key
from edgekit.engine.context import Context
from edgekit.engine.decoding_policy import with_rejection
from edgekit.engine.gating import Try, back_off
from edgekit.engine.keys import FACTS  # distill.unlabelled by its file's content
from edgekit.engine.measure import measure
from edgekit.engine.results import DistillResult, stage_row
from edgekit.engine.stages.common import prune_to, seed_everything, target_params
from edgekit.modeling.model import count_params, load_model, save_model
from edgekit.record import PassRecord

log = logging.getLogger("edgekit")


def _memo(ctx: Context, layer_map: list[int] | None, info: dict):
    """With distill.teacher: the teacher's outputs on the augmented utterances, kept in the cache (safetensors), so
    that another target or another distill.seed on the same teacher and vocabulary labels nothing again. They depend
    on the teacher, the utterances (the data, the augmentation settings, --seed, the student's vocabulary, which
    picks the novel words), the matched layers and the sequence length. None without distill.teacher: the build's
    own teacher labels them in a few minutes."""
    if taught_by(ctx) is not ctx.strong:
        return None
    from safetensors.torch import load_file, save_file

    d = ctx.settings.distill
    vocab = hashlib.sha256(ctx.tokenizer.sp.serialized_model_proto()).hexdigest()
    pool = {"augment": d.augment, "novel": d.novel, "word_noise": d.word_noise, "seed": ctx.cfg.seed,
            "layer_map": layer_map, "max_len": ctx.max_len, "student_vocab": vocab} | FACTS["unlabelled"](ctx)
    key = stage_key("teacher_targets", pool, ctx.strong.key)
    info.update(targets_key=key[:12], targets_reused=False)

    def memo(compute):
        entry = ctx.cache.get("teacher_targets", key)
        if entry is not None:
            log.info("distill: the teacher's outputs reused from the cache (%s)", key[:12])
            info["targets_reused"] = True
            return unpack_targets(load_file(str(entry.path / "targets.safetensors")))
        targets = compute()
        work = ctx.cache.workdir("teacher_targets")
        try:
            save_file(pack_targets(targets), str(work / "targets.safetensors"))
            ctx.cache.put("teacher_targets", key, work, {"examples": len(targets[0]), "layer_map": layer_map})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return targets

    return memo


def taught_by(ctx: Context):
    """The student's teacher: distill.teacher's, unless it taught the build's own teacher (distill.assistant)."""
    return ctx.strong if ctx.strong is not None and not ctx.settings.distill.assistant else ctx.teacher


def _try(ctx: Context, attempt: int, target: int) -> tuple:
    """One try: prune to `target` (the prune stage's own student on the first try), then distil. Cached."""
    c = ctx.settings.compress
    source = ctx.latest("distill")
    d = dataclasses.asdict(ctx.settings.distill)
    # relations off: each try's key is the one it had before the setting existed (the same student comes out; the
    # stage's own key, which reads every [distill] setting, does change: the stage re-runs once, its tries cached)
    # (the assistant's settings reach it through its input: the teacher it was pruned from)
    off = {"teacher", "assistant", "assistant_epochs", "assistant_lr", "unlabelled", "unlabelled_max"} | (
        {"relation_weight", "relation_heads"} if not d["relation_weight"] else set())
    settings = {"distill": {k: v for k, v in d.items() if k not in off}, "target": target,
                "prune_layers": c.prune_layers, "prune_samples": c.prune_samples} | FACTS["unlabelled"](ctx)
    teacher = taught_by(ctx)
    if teacher is ctx.strong:  # distill.teacher: by its own key (its recipe, base model and data), not its name
        settings["teacher_key"] = ctx.strong.key
    key = stage_key("distill_try", settings,
                    ctx.input_key if ctx.prune is None else (ctx.prune.out_key or ctx.prune.key))
    entry = ctx.cache.get("distill_try", key)
    if entry is not None:
        log.info("distill try %d: reused from the cache (%s)", attempt + 1, key[:12])
        r, model = entry.result, load_model(entry.path / "model.safetensors")
        # a try cached before the gates measured rejection (out-of-scope data) is measured so now
        return model, PassRecord.from_dict(r["record"]), with_rejection(ctx, r["dev"], model, ctx.tokenizer), \
            r["prune"], key
    seed_everything(ctx.settings.distill.seed)  # --seed, or distill.seed for the student alone
    if ctx.prune is None:  # no pruning in this build: distil into a copy of the previous model
        student, kept, prune_rec = source.model, None, None
    elif attempt == 0 or target == ctx.prune.target_params:
        student, kept, prune_rec = ctx.prune.model, ctx.prune.kept_layers, ctx.prune.record
    else:
        pr = prune_to(ctx, target)
        student, kept, prune_rec = pr.model, pr.record.extra["kept_layers"], pr.record.to_dict()
    # Each student layer matches the teacher layer it was pruned from (state index = layer + 1); a teacher of
    # another depth (distill.teacher) is matched evenly.
    strong = teacher is ctx.strong
    if strong:
        layer_map = uniform_layers(teacher.model.cfg.layers, student.cfg.layers)
    else:
        layer_map = [k + 1 for k in kept] if kept is not None else None
    info = {"base": ctx.settings.distill.teacher, "key": teacher.key[:12], "dev": teacher.dev} if strong else {}
    inputs = DistillInputs(teacher=teacher.model, teacher_tokenizer=teacher.tokenizer,
                           student_tokenizer=ctx.tokenizer, train=ctx.data.splits["train"],
                           dev=ctx.data.splits["dev"], labels=ctx.labels, max_len=ctx.max_len, layer_map=layer_map,
                           evaluate=lambda m: measure(ctx, m, ctx.tokenizer, "dev"),  # epochs chosen as shipped
                           pool_seed=ctx.cfg.seed if strong else None, unlabelled=ctx.unlabelled,
                           memo=_memo(ctx, layer_map if d["hidden_weight"] or d["relation_weight"] else None, info))
    res = distill(copy.deepcopy(student), inputs, ctx.settings.distill)
    if info:
        res.record.extra["teacher"] = info
    if ctx.unlabelled_dropped:
        res.record.extra["unlabelled_dropped"] = ctx.unlabelled_dropped  # equal to a dev or test utterance
    # dev metrics of the kept epoch, computed during distillation; with out-of-scope data, with rejection too
    dev = with_rejection(ctx, res.record.extra.pop("best_dev"), res.model, ctx.tokenizer)
    prune_info = {k: prune_rec["extra"][k] for k in ("target_params", "nonembedding_after", "kept_layers")} \
        if prune_rec else None
    work = ctx.cache.workdir("distill_try")
    try:
        save_model(res.model, work / "model.safetensors")
        ctx.cache.put("distill_try", key, work, {"record": res.record.to_dict(), "dev": dev, "prune": prune_info})
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone once put moved it; left only if saving failed
    return res.model, res.record, dev, prune_info, key


def run(ctx: Context) -> DistillResult:
    t0 = time.perf_counter()
    c, scale = ctx.settings.compress, 1.0
    target, cap = target_params(ctx) if ctx.prune is not None else (0, 0)  # no pruning: nothing to back off

    def attempt(i: int) -> Try:
        model, rec, dev, prune_info, try_key = _try(ctx, i, target)

        def grow(factor: float) -> bool:
            nonlocal scale, target
            if target >= cap:
                log.info("distill: the student is at the profile's cap (%d non-embedding params); no larger try", cap)
                return False
            scale *= factor
            target, _ = target_params(ctx, scale)
            return True

        nonemb = count_params(model, embeddings=False)
        return Try(dev, f"prune target x{scale:.2f}, {nonemb:,} non-embedding params", (model, rec, try_key, prune_info),
                   grow, extra={"prune": prune_info})

    kept, tries, over = back_off(ctx, "distill", c.max_retries, attempt)
    model, rec, out_key, shipped_prune = kept
    rec.metrics = measure(ctx, model, ctx.tokenizer, "test")
    teacher = ctx.teacher.model
    rec.extra.update(tries=tries, nonembedding_params=count_params(model, embeddings=False),
                     share_of_teacher_nonembedding=count_params(model, embeddings=False)
                     / count_params(teacher, embeddings=False),
                     share_of_teacher_total=count_params(model) / count_params(teacher),
                     caps={"param_share": c.max_param_share or c.param_share,
                           "total_share": c.max_total_share or c.total_share})
    if shipped_prune and shipped_prune["target_params"] != ctx.prune.target_params:
        rec.extra["shipped_prune"] = shipped_prune  # a back-off try: the prune stage's row shows the first target
    if over:
        rec.extra["over_budget"] = over
        rec.warnings.append(over["message"])
    rec.seconds = time.perf_counter() - t0
    row = stage_row("distill", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    return DistillResult(rec.to_dict(), row, out_key=out_key, tries=tries, over_budget=over, _model=model,
                         _tokenizer=ctx.tokenizer)
