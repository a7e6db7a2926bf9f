"""Scores by label: precision, recall and F1 for each intent and, at span level, each slot type; the intents'
confusion counts; the answers that are not an exact match. No torch: `edgekit eval` and the build share these.

Semantics are those of sklearn's `precision_recall_fscore_support` (zero_division=0) over the labels present in
the gold or the answers, and of seqeval/conlleval for spans (`chunks`): a row's `support` is its gold count,
`predicted` its count among the answers, `tp` the matches. A figure whose denominator is 0 (precision of a label
never answered, recall of one never in gold) is 0, as sklearn's zero_division=0 gives; `macro` is the plain mean
of the rows, `micro` pools the counts (for intents it is accuracy; for slots it is `metrics.slot_f1`).
"""

from __future__ import annotations

from collections import Counter

from edgekit.scoring.metrics import chunks, prf


def _ordered(seen: set[str], order) -> list[str]:
    """The labels seen, those of `order` first in its order, then the others sorted."""
    first = [x for x in dict.fromkeys(order) if x in seen]
    return first + sorted(seen - set(first))


def _table(tp: Counter, n_pred: Counter, n_gold: Counter, order: list[str]) -> dict:
    """{"rows": [{label, precision, recall, f1, support, predicted, tp}], "micro": {...}, "macro": {...}}: a row
    for each label with gold or answers, in `order` first, then the others sorted."""
    labels = _ordered(set(n_gold) | set(n_pred), order)
    rows = []
    for x in labels:
        p, r, f = prf(tp[x], n_pred[x], n_gold[x])
        rows.append({"label": x, "precision": p, "recall": r, "f1": f, "support": n_gold[x],
                     "predicted": n_pred[x], "tp": tp[x]})
    T, P, G = sum(tp.values()), sum(n_pred.values()), sum(n_gold.values())
    p, r, f = prf(T, P, G)
    k = max(1, len(rows))
    return {"rows": rows, "micro": {"precision": p, "recall": r, "f1": f, "support": G, "predicted": P, "tp": T},
            "macro": {m: sum(row[m] for row in rows) / k for m in ("precision", "recall", "f1")}}


def intent_table(gold: list[str], pred: list[str], order: list[str] = ()) -> dict:
    """Per-intent scores (single-label: every answer is one prediction, so micro P = R = F1 = accuracy)."""
    if len(gold) != len(pred):
        raise ValueError(f"need equally many gold and predicted intents ({len(gold)} vs {len(pred)})")
    tp = Counter(g for g, p in zip(gold, pred) if g == p)
    return _table(tp, Counter(pred), Counter(gold), order)


def slot_table(gold_tags: list[list[str]], pred_tags: list[list[str]], order: list[str] = ()) -> dict:
    """Per-slot-type span scores: exact (type, start, end) matches of `chunks`, pooled over all sentences."""
    tp, n_pred, n_gold = Counter(), Counter(), Counter()
    for g, p in zip(gold_tags, pred_tags):
        gc, pc = chunks(g), chunks(p)
        n_gold.update(t for t, _, _ in gc)
        n_pred.update(t for t, _, _ in pc)
        tp.update(t for t, _, _ in gc & pc)
    return _table(tp, n_pred, n_gold, order)


def confusion_counts(gold: list[str], pred: list[str], order: list[str] = ()) -> dict:
    """The intents' confusion, sparse: {"labels": [every label in gold or answers, `order` first],
    "counts": {gold: {answered: n}}} with only the cells that are not 0."""
    cells = Counter(zip(gold, pred))
    labels = _ordered(set(gold) | set(pred), order)
    rank = {x: k for k, x in enumerate(labels)}
    counts: dict[str, dict[str, int]] = {}
    for (g, p), n in sorted(cells.items(), key=lambda c: (rank[c[0][0]], rank[c[0][1]])):
        counts.setdefault(g, {})[p] = n
    return {"labels": labels, "counts": counts}


def slot_spans(words: list[str], tags: list[str] | None) -> list[dict]:
    """Spans as scoring reads them (`chunks`), over words: [{"slot", "value", "words": [start, end)}], in order."""
    if not tags:
        return []
    return [{"slot": t, "value": " ".join(words[s:e]), "words": [s, e]}
            for t, s, e in sorted(chunks(tags), key=lambda c: (c[1], c[2], c[0]))]


def error_records(examples: list, answers: list[dict], has_slots: bool) -> list[dict]:
    """Every answer that is not an exact match (its intent, or any slot tag, differs from gold), confident
    mistakes first: by path_confidence (the whole answer's), highest first, or by confidence where the answers
    have none (intent-only packages); ties keep the split's order. `index` is the utterance's place in the split;
    `file` and `line` where the data was read from."""
    out = []
    for i, (ex, a) in enumerate(zip(examples, answers)):
        tags = a.get("tags", ["O"] * len(ex.words)) if has_slots else None
        wrong = [part for part, bad in (("intent", a["intent"] != ex.intent),
                                        ("slots", has_slots and tags != ex.tags)) if bad]
        if not wrong:
            continue
        rec = {"index": i, "text": ex.text, "wrong": wrong, "gold": {"intent": ex.intent},
               "answer": {"intent": a["intent"]}, "confidence": a["confidence"]}
        if has_slots:
            rec["gold"].update(slots=slot_spans(ex.words, ex.tags), tags=ex.tags)
            rec["answer"].update(slots=slot_spans(ex.words, tags), tags=tags)
        if "path_confidence" in a:
            rec["path_confidence"] = a["path_confidence"]
        if getattr(ex, "file", None):  # where the reader found it, so a wrong gold label can be fixed there
            rec.update(file=ex.file, line=ex.line)
        out.append(rec)
    key = "path_confidence" if out and all("path_confidence" in r for r in out) else "confidence"
    return sorted(out, key=lambda r: -r[key])
