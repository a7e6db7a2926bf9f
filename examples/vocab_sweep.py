"""What a vocabulary costs the teacher: the build's fine-tuned teacher (from the stage cache; trained first if it is
not there), trimmed to each vocabulary asked for, scored on test as the package decodes (intent whitelist,
constrained BIO), before any pruning or distillation. Dev is printed beside it: it cannot see base words, since
every dev word is in the task corpus.

    python examples/vocab_sweep.py ../shared/data/snips --target android --tries 8000:0 0:0 0:10000
    python examples/vocab_sweep.py ../shared/data/snips --target server-cpu --base-model mpnet --tries 0:0 0:10000

Each try is BUDGET:BASE_WORDS[:RANK] (`compress.vocab_budget`, 0 for every task piece; `compress.base_words`;
`compress.embedding_rank`, the word embedding factorised by SVD); `none` scores the untrimmed teacher.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time


def main(data: str, target: str, base_model: str | None, tries: list[str]) -> None:
    from edgekit.converters.trim_vocab import TrimVocabConfig, trim_vocab
    from edgekit.engine.config import BuildConfig
    from edgekit.engine.keys import key_of
    from edgekit.engine.measure import measure
    from edgekit.engine.runner import prepare, run_stage
    from edgekit.engine.stages.trim_vocab import corpus

    with tempfile.TemporaryDirectory() as out:
        ctx = prepare(BuildConfig(data=data, out=out, target=target, base_model=base_model))
    ctx.teacher = run_stage(ctx, "teacher", key_of(ctx, "teacher", ctx.input_digest), ctx.input_digest)
    texts = corpus(ctx)
    print("try | pieces | dev intent / slot F1 | test intent / slot F1 | seconds")
    for t in tries:
        t0 = time.perf_counter()
        if t == "none":
            model, tok = ctx.teacher.model, ctx.teacher.tokenizer
        else:
            budget, base, rank = ([int(x) for x in t.split(":")] + [0])[:3]
            res = trim_vocab(copy.deepcopy(ctx.teacher.model), ctx.teacher.tokenizer, texts,
                             TrimVocabConfig(budget or None, ctx.max_len, rank or None, base_words=base))
            model, tok = res.model, res.tokenizer
        dev, test = (measure(ctx, model, tok, s) for s in ("dev", "test"))
        print(f"{t} | {tok.vocab_size:,} | {100 * dev['intent_acc']:.2f} / {100 * dev.get('slot_f1', 0):.2f} | "
              f"{100 * test['intent_acc']:.2f} / {100 * test.get('slot_f1', 0):.2f} | "
              f"{time.perf_counter() - t0:.0f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--target", default="android")
    ap.add_argument("--base-model", default=None)
    ap.add_argument("--tries", nargs="+", default=["none", "0:0", "0:10000"])
    a = ap.parse_args()
    main(a.data, a.target, a.base_model, a.tries)
