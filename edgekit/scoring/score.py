"""Answers scored against gold examples, and answer lists against each other. No torch: `edgekit eval`, compare
and the build's scoring share these."""

from __future__ import annotations

from edgekit.data.dataset import Dataset
from edgekit.data.formats import Example
from edgekit.scoring.metrics import metrics_of


def labels_of(data: Dataset) -> dict:
    """The label sets as the package stores them (labels.json)."""
    return {"intents": data.intents, "slot_tags": data.slot_tags, "oos_label": data.oos_label}


def score(examples: list[Example], preds: list[dict], labels: dict) -> dict:
    """Metrics of predictions (runtime answer dicts) against gold examples."""
    has_slots = bool(labels["slot_tags"]) and all(ex.tags is not None for ex in examples)
    gold_tags = [ex.tags for ex in examples] if has_slots else None
    pred_tags = [p.get("tags", ["O"] * len(ex.words)) for p, ex in zip(preds, examples)] if has_slots else None
    return metrics_of([ex.intent for ex in examples], [p["intent"] for p in preds], gold_tags, pred_tags,
                    labels.get("oos_label"))


def agreement(a: list[dict], b: list[dict]) -> float:
    """Share of utterances where two answer lists give the same intent and the same slot tags."""
    same = sum(x["intent"] == y["intent"] and x.get("tags") == y.get("tags") for x, y in zip(a, b))
    return same / max(1, len(a))


def dev_score(m: dict) -> float:
    """Model selection on dev: mean of intent accuracy and slot F1 (intent accuracy alone without slots)."""
    return m["intent_acc"] if m["slot_f1"] is None else (m["intent_acc"] + m["slot_f1"]) / 2
