"""Answers scored against gold examples, and answer lists against each other. No torch: `edgekit eval`, compare
and the build's scoring share these."""

from __future__ import annotations

from edgekit.data.dataset import Dataset
from edgekit.data.formats import Example
from edgekit.runtime.decode import OOS
from edgekit.scoring.labels import confusion_counts, intent_table, slot_table
from edgekit.scoring.metrics import metrics_of


def labels_of(data: Dataset) -> dict:
    """The label sets as the package stores them (labels.json)."""
    return {"intents": data.intents, "slot_tags": data.slot_tags, "oos_label": data.oos_label}


def has_slots(examples: list[Example], labels: dict) -> bool:
    """Whether answers are scored on slots too: the package tags slots and every example has tags."""
    return bool(labels["slot_tags"]) and all(ex.tags is not None for ex in examples)


def _tags(examples: list[Example], preds: list[dict], labels: dict):
    """Gold and answered tag lists (an answer without tags: all O), or (None, None) without slots."""
    if not has_slots(examples, labels):
        return None, None
    return [ex.tags for ex in examples], [p.get("tags", ["O"] * len(ex.words)) for p, ex in zip(preds, examples)]


def score(examples: list[Example], preds: list[dict], labels: dict) -> dict:
    """Metrics of predictions (runtime answer dicts) against gold examples."""
    gold_tags, pred_tags = _tags(examples, preds, labels)
    return metrics_of([ex.intent for ex in examples], [p["intent"] for p in preds], gold_tags, pred_tags,
                    labels.get("oos_label"))


def by_label(examples: list[Example], preds: list[dict], labels: dict) -> dict:
    """Scores by label (edgekit.scoring.labels): {"intents": table, "slots": table or None, "confusion": the
    intents' sparse counts, "oos": the out-of-scope answer's name}. Rows follow labels.json's order, the
    out-of-scope answer after the intents."""
    gold, pred, oos = [ex.intent for ex in examples], [p["intent"] for p in preds], labels.get("oos_label") or OOS
    order = list(labels["intents"]) + [oos]
    gold_tags, pred_tags = _tags(examples, preds, labels)
    types = list(dict.fromkeys(t[2:] for t in labels.get("slot_tags") or [] if t != "O"))
    return {"intents": intent_table(gold, pred, order),
            "slots": slot_table(gold_tags, pred_tags, types) if gold_tags is not None else None,
            "confusion": confusion_counts(gold, pred, order), "oos": oos}


def agreement(a: list[dict], b: list[dict]) -> float:
    """Share of utterances where two answer lists give the same intent and the same slot tags."""
    same = sum(x["intent"] == y["intent"] and x.get("tags") == y.get("tags") for x, y in zip(a, b))
    return same / max(1, len(a))


def dev_score(m: dict) -> float:
    """Model selection on dev: mean of intent accuracy and slot F1 (intent accuracy alone without slots)."""
    return m["intent_acc"] if m["slot_f1"] is None else (m["intent_acc"] + m["slot_f1"]) / 2
