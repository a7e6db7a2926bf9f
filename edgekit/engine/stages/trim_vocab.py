"""Stage `trim_vocab`: the task vocabulary as SentencePiece; gate on dev; back off to a larger vocabulary."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from pathlib import Path

from edgekit.converters.trim_vocab import TrimVocabConfig, trim_vocab
from edgekit.engine.cache import digest_files, stage_key
from edgekit.engine.context import Context
from edgekit.engine.decoding_policy import with_rejection
from edgekit.engine.gating import Try, back_off
from edgekit.engine.measure import argmax_answers, measure
from edgekit.engine.results import TrimResult, stage_row

log = logging.getLogger("edgekit")


def corpus(ctx: Context) -> list[str]:
    """Task utterances whose pieces the vocabulary keeps: train + dev, plus compress.vocab_corpus lines."""
    texts = [ex.text for s in ("train", "dev") for ex in ctx.data.splits[s]]
    extra = ctx.settings.compress.vocab_corpus
    if extra:
        texts += [line for line in Path(extra).read_text(encoding="utf-8").splitlines() if line.strip()]
    return texts


def run(ctx: Context) -> TrimResult:
    t0 = time.perf_counter()
    c, prev = ctx.settings.compress, ctx.latest("trim_vocab")
    texts = corpus(ctx)
    budget = c.vocab_budget

    def attempt(i: int) -> Try:
        tried_budget = budget
        cfg = TrimVocabConfig(tried_budget, ctx.max_len, c.embedding_rank, c.base_words)
        res = trim_vocab(copy.deepcopy(prev.model), prev.tokenizer, texts, cfg)
        # The gate judges the vocabulary: a factorised table loses most of its accuracy until distillation
        # recovers it (SNIPS, rank 128: dev slot F1 60.6; rank 64: 24.1; 94.1-94.3 test once distilled), and the
        # distill gate holds the student to the budget, so the same trim unfactorised is what is measured here
        judged = res if not c.embedding_rank else trim_vocab(copy.deepcopy(prev.model), prev.tokenizer, texts,
                                                             dataclasses.replace(cfg, embedding_rank=None))

        def grow(factor: float) -> bool:
            nonlocal budget
            if tried_budget is None:
                return False
            grown = int(tried_budget * factor)
            budget = grown if grown < res.record.extra["vocab_task"] else None  # past the task vocabulary: all
            return True

        dev = with_rejection(ctx, measure(ctx, judged.model, judged.tokenizer, "dev"), judged.model, judged.tokenizer)
        return Try(dev, f"vocabulary budget {tried_budget or 'none'}", (res, tried_budget), grow,
                   note=f"{res.tokenizer.vocab_size} pieces, ")

    (res, budget), tries, over = back_off(ctx, "trim_vocab", c.max_retries, attempt)
    model, tok, rec = res.model, res.tokenizer, res.record
    # a budget at or above the task vocabulary keeps every task piece: the same output as no budget
    kept_budget = budget if budget is not None and budget < rec.extra["vocab_task"] else None
    rec.metrics = measure(ctx, model, tok, "test")
    answers = argmax_answers(ctx, model, tok)
    teacher = argmax_answers(ctx, ctx.teacher.model, ctx.teacher.tokenizer)
    rec.extra["intent_agreement_with_teacher"] = sum(a["intent"] == b["intent"]
                                                     for a, b in zip(answers, teacher)) / len(answers)
    if kept_budget is not None:  # the accuracy cost of the budget: the same trim at the full task vocabulary
        full = trim_vocab(copy.deepcopy(prev.model), prev.tokenizer, texts,
                          TrimVocabConfig(None, ctx.max_len, c.embedding_rank, c.base_words))
        rec.extra["full_vocab"] = {"vocab": full.record.extra["vocab_after"], "params": full.record.params_after,
                                   "test": measure(ctx, full.model, full.tokenizer, "test")}
    rec.extra["tries"] = tries
    if over:
        rec.extra["over_budget"] = over
        rec.warnings.append(over["message"])
    rec.seconds = time.perf_counter() - t0
    row = stage_row("trim_vocab", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    # The output is the kept try: another budget or retry count that keeps the same vocabulary reuses what follows.
    extra = digest_files([Path(c.vocab_corpus)]) if c.vocab_corpus else None
    out = stage_key("trim_vocab_output", {"budget": kept_budget, "max_len": ctx.max_len,
                                          "embedding_rank": c.embedding_rank, "vocab_corpus": extra,
                                          **({"base_words": c.base_words} if c.base_words else {})}, ctx.input_key)
    return TrimResult(rec.to_dict(), row, out_key=out, _model=model, _tokenizer=tok)
