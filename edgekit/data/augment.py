"""Training-time augmentation: new utterances made from the training set by swapping slot mentions between
utterances, or by replacing words. Used by distillation (converters/distill.py)."""

from __future__ import annotations

from collections import defaultdict

from edgekit.data.formats import Example


def _mentions(tags: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, slot) of each BIO chunk; an I- without its B- starts a chunk, as conlleval reads it."""
    out, start, slot = [], None, None
    for i, t in enumerate(tags + ["O"]):
        if t.startswith("I-") and slot == t[2:]:
            continue
        if slot is not None:
            out.append((start, i, slot))
            start, slot = None, None
        if t != "O":
            start, slot = i, t[2:]
    return out


def open_slots(examples: list[Example], min_values: int = 30, min_ratio: float = 0.3) -> set[str]:
    """Open-class slots (names, titles, places): many distinct values for their occurrences, mostly words (slots
    whose values often hold digits, such as dates and times, are not names)."""
    seen, count = defaultdict(set), defaultdict(int)
    for ex in examples:
        for s, e, slot in _mentions(ex.tags or []):
            seen[slot].add(tuple(ex.words[s:e]))
            count[slot] += 1

    def wordy(values) -> bool:
        return sum(any(c.isdigit() for w in v for c in w) for v in values) <= 0.1 * len(values)

    return {k for k, v in seen.items() if len(v) >= min_values and len(v) / count[k] >= min_ratio and wordy(v)}


def swap_mentions(examples: list[Example], n: int, seed: int = 0, novel_words: list[str] | None = None,
                  novel_share: float = 0.0) -> list[Example]:
    """`n` new examples: copies of random slot-bearing examples whose every slot value is replaced by another value
    of the same slot seen in `examples`, drawn uniformly over the distinct values.

    Drawing over distinct values, not occurrences, shows the model rare values (the ones a vocabulary budget
    splits into small pieces) as often as common ones, in many contexts: it has to read the context, not
    memorise names. With `novel_words`, a `novel_share` of the open-class values (see `open_slots`) is made of
    those words instead (as many as the drawn value has): names the data never had, as at test time."""
    import random

    rng = random.Random(seed)
    values: dict[str, set] = defaultdict(set)
    for ex in examples:
        for s, e, slot in _mentions(ex.tags or []):
            values[slot].add(tuple(ex.words[s:e]))
    pool = {slot: sorted(v) for slot, v in values.items()}
    opened = open_slots(examples) if novel_words else set()
    sources = [ex for ex in examples if ex.tags and any(t != "O" for t in ex.tags)]
    out = []
    for _ in range(n if sources else 0):
        ex = rng.choice(sources)
        words, tags, last = [], [], 0
        for s, e, slot in _mentions(ex.tags):
            value = list(rng.choice(pool[slot]))
            if slot in opened and rng.random() < novel_share:
                value = [rng.choice(novel_words) for _ in value]
            words += ex.words[last:s] + value
            tags += ex.tags[last:s] + [f"B-{slot}"] + [f"I-{slot}"] * (len(value) - 1)
            last = e
        out.append(Example(words + ex.words[last:], ex.intent, tags + ex.tags[last:]))
    return out


def replace_words(examples: list[Example], n: int, seed: int = 0, share: float = 0.15) -> list[Example]:
    """`n` new intent-only examples: copies of random examples with each word, at rate `share`, replaced by a
    word drawn uniformly from the distinct words of `examples` (as TinyBERT augments: the teacher labels the
    perturbed utterances, so the student sees its answers off the training points, not only on them)."""
    import random

    rng = random.Random(seed)
    vocab = sorted({w for ex in examples for w in ex.words})
    out = []
    for _ in range(n if vocab else 0):
        ex = rng.choice(examples)
        out.append(Example([rng.choice(vocab) if rng.random() < share else w for w in ex.words], ex.intent, None))
    return out
