"""Stage `teacher`: fine-tune the base encoder with joint intent + slot heads; best dev epoch kept.

With distill.assistant, the fine-tuned teacher then learns from distill.teacher (a base-size model) by
distillation, and that teacher assistant is the stage's output: the student is pruned from it and learns from it.
"""

from __future__ import annotations

import copy
import time

from edgekit.engine.context import Context
from edgekit.engine.decoding_policy import with_rejection
from edgekit.engine.measure import choose_intent_slots, measure
from edgekit.engine.results import TeacherResult, stage_row
from edgekit.modeling.model import count_params, gather_embeddings, param_bytes
from edgekit.modeling.pretrained import load_pretrained
from edgekit.modeling.training import train_teacher
from edgekit.record import PassRecord


def run(ctx: Context) -> TeacherResult:
    if ctx.fine_tuned is not None:  # distill.assistant
        model, rec = _assistant(ctx)
    else:
        model = load_pretrained(ctx.base_model, len(ctx.data.intents), len(ctx.data.slot_tags))
        gather_embeddings(model, ctx.base_rows)  # WordPiece rows -> the teacher's SentencePiece ids
        model, rec = train_teacher(model, ctx.data, ctx.base_tokenizer, ctx.settings.teacher)
    t1 = time.perf_counter()
    table, choice = choose_intent_slots(ctx, model, ctx.base_tokenizer)
    res = TeacherResult(record={}, row={}, intent_slots=table, intent_slots_choice=choice,
                        _model=model, _tokenizer=ctx.base_tokenizer)
    ctx.teacher = res  # evaluation decodes with the teacher's intent-slot table
    rec.metrics = measure(ctx, model, ctx.base_tokenizer, "test")
    res.dev = with_rejection(ctx, measure(ctx, model, ctx.base_tokenizer, "dev"), model, ctx.base_tokenizer)
    rec.extra["dev"] = res.dev
    rec.seconds += time.perf_counter() - t1
    res.record = rec.to_dict()
    res.row = stage_row("teacher", rec.metrics, count_params(model), rec.bytes_after, rec.seconds)
    return res


def _assistant(ctx: Context) -> tuple:
    """The fine-tuned teacher, distilled from distill.teacher: its logits on the augmented utterances (no hidden
    states: the assistant keeps its full width), at a fine-tuning rate. Returns the model and the stage's record."""
    from edgekit.converters.distill import DistillConfig, DistillInputs, distill

    t0 = time.perf_counter()
    plain, d, t = ctx.fine_tuned(), ctx.settings.distill, ctx.settings.teacher
    cfg = DistillConfig(temperature=d.temperature, alpha=d.alpha, hidden_weight=0.0, augment=d.augment,
                        word_noise=d.word_noise, novel=d.novel, epochs=d.assistant_epochs, batch_size=t.batch_size,
                        lr=d.assistant_lr, seed=ctx.cfg.seed, steps_limit=t.steps_limit, bf16=t.bf16)
    inputs = DistillInputs(teacher=ctx.strong.model, teacher_tokenizer=ctx.strong.tokenizer,
                           student_tokenizer=ctx.base_tokenizer, train=ctx.data.splits["train"],
                           dev=ctx.data.splits["dev"], labels=ctx.labels, max_len=t.max_len)
    res = distill(copy.deepcopy(plain.model), inputs, cfg)
    rec = PassRecord("teacher", params_after=count_params(res.model), bytes_after=param_bytes(res.model),
                     seconds=time.perf_counter() - t0)
    rec.extra["assistant"] = dict(res.record.extra, taught_by={"base": d.teacher, "key": ctx.strong.key[:12],
                                                               "dev": ctx.strong.dev},
                                  fine_tuned={"key": plain.key[:12], "test": plain.record.get("metrics"),
                                              "dev": plain.dev, "seconds": plain.record.get("seconds")})
    return res.model, rec
