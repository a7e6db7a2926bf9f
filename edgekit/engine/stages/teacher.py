"""Stage `teacher`: fine-tune the base encoder with joint intent + slot heads; best dev epoch kept."""

from __future__ import annotations

import time

from edgekit.engine.context import Context
from edgekit.engine.measure import choose_intent_slots, measure
from edgekit.engine.results import TeacherResult, stage_row
from edgekit.modeling.model import count_params, gather_embeddings
from edgekit.modeling.pretrained import load_pretrained
from edgekit.modeling.training import train_teacher


def run(ctx: Context) -> TeacherResult:
    model = load_pretrained(ctx.base_model, len(ctx.data.intents), len(ctx.data.slot_tags))
    gather_embeddings(model, ctx.base_rows)  # WordPiece rows -> the teacher's SentencePiece ids
    model, rec = train_teacher(model, ctx.data, ctx.base_tokenizer, ctx.settings.teacher)
    t1 = time.perf_counter()
    table, choice = choose_intent_slots(ctx, model, ctx.base_tokenizer)
    res = TeacherResult(record={}, row={}, intent_slots=table, intent_slots_choice=choice,
                        _model=model, _tokenizer=ctx.base_tokenizer)
    ctx.teacher = res  # evaluation decodes with the teacher's intent-slot table
    rec.metrics = measure(ctx, model, ctx.base_tokenizer, "test")
    res.dev = measure(ctx, model, ctx.base_tokenizer, "dev")
    rec.extra["dev"] = res.dev
    rec.seconds += time.perf_counter() - t1
    res.record = rec.to_dict()
    res.row = stage_row("teacher", rec.metrics, count_params(model), rec.bytes_after, rec.seconds)
    return res
