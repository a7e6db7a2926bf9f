"""Intent accuracy, span-level slot F1 with conlleval semantics, exact match, out-of-scope figures."""

from __future__ import annotations


def chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """Spans (type, start, end) as conlleval reads BIO: an I-x after O or after another type opens a chunk."""
    out, typ, start = set(), None, 0
    for i, t in enumerate(list(tags) + ["O"]):
        prefix, ty = (t[0], t[2:]) if t != "O" and len(t) > 2 and t[1] == "-" else ("O", "")
        if typ is not None and (prefix in ("B", "O") or ty != typ):
            out.add((typ, start, i))
            typ = None
        if prefix in ("B", "I") and typ is None:
            typ, start = ty, i
    return out


def invalid_bio(seqs: list[list[str] | None]) -> int:
    """Number of tag sequences with an I-x that follows neither B-x nor I-x (None entries: no slots, skipped)."""
    bad = 0
    for tags in seqs:
        prev = "O"
        for t in tags or []:
            if t.startswith("I-") and prev[2:] != t[2:]:
                bad += 1
                break
            prev = t
    return bad


def prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts; a figure whose denominator is 0 is 0 (sklearn's zero_division=0)."""
    prec, rec = (tp / n_pred if n_pred else 0.0), (tp / n_gold if n_gold else 0.0)
    return prec, rec, (2 * prec * rec / (prec + rec) if tp else 0.0)


def slot_f1(gold: list[list[str]], pred: list[list[str]]) -> float:
    """Micro F1 over exact span matches, pooled over all sentences (conlleval's overall FB1 / 100)."""
    tp = n_gold = n_pred = 0
    for g, p in zip(gold, pred):
        gc, pc = chunks(g), chunks(p)
        tp += len(gc & pc)
        n_gold += len(gc)
        n_pred += len(pc)
    return prf(tp, n_pred, n_gold)[2]


def metrics_of(gold_intents: list[str], pred_intents: list[str], gold_tags: list[list[str]] | None = None,
             pred_tags: list[list[str]] | None = None, oos_label: str | None = None) -> dict:
    """All metrics in one dict. slot_f1 is None for intent-only data; OOS figures only when oos_label is set."""
    n = len(gold_intents)
    if n == 0 or len(pred_intents) != n:
        raise ValueError(f"need equally many gold and predicted intents ({n} vs {len(pred_intents)})")
    intent_ok = [g == p for g, p in zip(gold_intents, pred_intents)]
    out = {"n": n, "intent_acc": sum(intent_ok) / n, "slot_f1": None}
    if gold_tags is not None and pred_tags is not None:
        out["slot_f1"] = slot_f1(gold_tags, pred_tags)
        out["exact_match"] = sum(ok and g == p for ok, g, p in zip(intent_ok, gold_tags, pred_tags)) / n
    else:
        out["exact_match"] = out["intent_acc"]
    if oos_label is not None:
        ins = [ok for g, ok in zip(gold_intents, intent_ok) if g != oos_label]
        oos = [p == oos_label for g, p in zip(gold_intents, pred_intents) if g == oos_label]
        out["in_scope_acc"] = sum(ins) / len(ins) if ins else None
        out["oos_recall"] = sum(oos) / len(oos) if oos else None
    return out
