"""Scores by label, errors.jsonl's records and the confusion picture, on hand-made cases whose every figure is
known."""

import pytest

from edgekit.data.formats import Example
from edgekit.scoring.labels import confusion_counts, error_records, intent_table, slot_table
from edgekit.scoring.metrics import metrics_of, slot_f1
from edgekit.scoring.score import by_label

GOLD = ["A", "A", "A", "B", "B", "C", "oos", "oos"]
PRED = ["A", "A", "B", "B", "C", "C", "oos", "A"]
# gold, answered: sentence 2 a wrong span, 3 a missed y, 4 an invented z, 5 an I-y that conlleval opens as a span
GOLD_TAGS = [["B-x", "I-x", "O", "B-y"], ["B-x", "O"], ["O", "B-y"], ["O", "O"], ["I-y", "O"]]
PRED_TAGS = [["B-x", "I-x", "O", "B-y"], ["B-x", "I-x"], ["O", "O"], ["B-z", "O"], ["B-y", "O"]]


def rows(table):
    return {r["label"]: (r["precision"], r["recall"], r["f1"], r["support"], r["predicted"], r["tp"])
            for r in table["rows"]}


def assert_rows(table, expected):
    """Each label's (precision, recall, F1, support, predicted, tp), and no other label."""
    got = rows(table)
    assert got.keys() == expected.keys()
    for label, want in expected.items():
        assert got[label] == pytest.approx(want), label


def test_intent_table_by_hand():
    t = intent_table(GOLD, PRED, ["A", "B", "C", "D", "oos"])
    # A: 3 gold, 3 answered (0, 1, 7), 2 right; B: 2, 2, 1; C: 1, 2, 1; oos: 2, 1, 1; D: never seen, no row
    assert [r["label"] for r in t["rows"]] == ["A", "B", "C", "oos"]
    assert_rows(t, {"A": (2 / 3, 2 / 3, 2 / 3, 3, 3, 2), "B": (0.5, 0.5, 0.5, 2, 2, 1),
                    "C": (0.5, 1, 2 / 3, 1, 2, 1), "oos": (1, 0.5, 2 / 3, 2, 1, 1)})
    # micro pools the counts: single-label, so P = R = F1 = accuracy; macro is the rows' plain mean
    acc = metrics_of(GOLD, PRED)["intent_acc"]
    assert acc == 5 / 8 and t["micro"] == {"precision": acc, "recall": acc, "f1": acc, "support": 8, "predicted": 8,
                                           "tp": 5}
    assert t["macro"] == pytest.approx({"precision": 2 / 3, "recall": 2 / 3, "f1": 5 / 8})
    # an answer no gold has (the runtime's own oos on data without an out-of-scope class): a row, F1 0
    t2 = intent_table(["A", "B"], ["A", "oos"], ["A", "B"])
    assert rows(t2)["oos"] == (0, 0, 0, 0, 1, 0) and rows(t2)["B"] == (0, 0, 0, 1, 0, 0)


def test_slot_table_by_hand_and_micro_is_slot_f1():
    t = slot_table(GOLD_TAGS, PRED_TAGS, ["y", "x", "z"])
    # x: gold 2, answered 2, 1 right; y: gold 3, answered 2, 2 right (I-y after O is a span, as conlleval reads
    # it); z: answered once, never gold
    assert [r["label"] for r in t["rows"]] == ["y", "x", "z"]
    assert_rows(t, {"x": (0.5, 0.5, 0.5, 2, 2, 1), "y": (1, 2 / 3, 0.8, 3, 2, 2), "z": (0, 0, 0, 0, 1, 0)})
    assert t["micro"]["f1"] == slot_f1(GOLD_TAGS, PRED_TAGS) == pytest.approx(0.6)
    assert (t["micro"]["support"], t["micro"]["predicted"], t["micro"]["tp"]) == (5, 5, 3)
    assert t["macro"]["f1"] == pytest.approx((0.5 + 0.8 + 0) / 3)


def test_by_label_on_examples_and_answers():
    labels = {"intents": ["A", "B", "C"], "slot_tags": ["O", "B-x", "I-x", "B-y", "I-y", "B-z", "I-z"],
              "oos_label": "oos"}
    words = [["w"] * len(t) for t in GOLD_TAGS] + [["w"]] * 3
    examples = [Example(w, g, t) for w, g, t in zip(words, GOLD, GOLD_TAGS + [["O"]] * 3)]
    answers = [{"intent": p, "confidence": 0.5, "tags": t} for p, t in zip(PRED, PRED_TAGS + [["O"]] * 3)]
    by = by_label(examples, answers, labels)
    m = metrics_of(GOLD, PRED, [e.tags for e in examples], [a["tags"] for a in answers], "oos")
    assert by["intents"]["micro"]["f1"] == m["intent_acc"] and by["slots"]["micro"]["f1"] == m["slot_f1"]
    assert sum(r["support"] for r in by["intents"]["rows"]) == len(examples)
    assert by["oos"] == "oos" and by["confusion"]["labels"] == ["A", "B", "C", "oos"]
    assert by["confusion"]["counts"] == {"A": {"A": 2, "B": 1}, "B": {"B": 1, "C": 1}, "C": {"C": 1},
                                         "oos": {"A": 1, "oos": 1}}
    # intent-only data: no slot table
    bare = by_label([Example(["w"], g) for g in GOLD], [{"intent": p} for p in PRED], {**labels, "slot_tags": []})
    assert bare["slots"] is None and bare["intents"] == by["intents"]


def _ex(intent, tags):
    return Example(["play", "some", "jazz"][: len(tags)], intent, tags)


def test_error_records_content_and_order():
    examples = [_ex("A", ["O", "O", "B-g"]), _ex("A", ["O", "O", "B-g"]), _ex("B", ["O", "B-g", "I-g"]),
                _ex("C", ["O", "O", "B-g"])]
    answers = [{"intent": "A", "confidence": 0.9, "path_confidence": 0.8, "tags": ["O", "O", "B-g"]},  # exact
               {"intent": "B", "confidence": 0.7, "path_confidence": 0.6, "tags": ["O", "O", "B-g"]},
               {"intent": "B", "confidence": 0.99, "path_confidence": 0.5, "tags": ["O", "O", "B-g"]},
               {"intent": "A", "confidence": 0.3, "path_confidence": 0.95, "tags": ["O", "O", "O"]}]
    errs = error_records(examples, answers, True)
    # confident mistakes first, by the whole answer's score (by confidence alone the order would be 2, 1, 3)
    assert [e["index"] for e in errs] == [3, 1, 2]
    assert [e["wrong"] for e in errs] == [["intent", "slots"], ["intent"], ["slots"]]
    assert errs[2] == {"index": 2, "text": "play some jazz", "wrong": ["slots"],
                       "gold": {"intent": "B", "slots": [{"slot": "g", "value": "some jazz", "words": [1, 3]}],
                                "tags": ["O", "B-g", "I-g"]},
                       "answer": {"intent": "B", "slots": [{"slot": "g", "value": "jazz", "words": [2, 3]}],
                                  "tags": ["O", "O", "B-g"]},
                       "confidence": 0.99, "path_confidence": 0.5}
    # as many as exact match misses
    m = metrics_of([e.intent for e in examples], [a["intent"] for a in answers], [e.tags for e in examples],
                   [a["tags"] for a in answers])
    assert len(errs) == round(len(examples) * (1 - m["exact_match"]))
    # intent-only answers (no path_confidence): by confidence, no slot fields
    bare = error_records(examples, [{k: a[k] for k in ("intent", "confidence")} for a in answers], False)
    assert [e["index"] for e in bare] == [1, 3] and all(set(e["gold"]) == {"intent"} for e in bare)
    assert "path_confidence" not in bare[0]


def test_a_tag_difference_with_equal_spans_is_an_error():
    """exact match compares tags: an I-x that opens a span against a B-x is wrong though the spans are equal."""
    errs = error_records([_ex("A", ["I-g"])], [{"intent": "A", "confidence": 1.0, "tags": ["B-g"]}], True)
    assert errs[0]["wrong"] == ["slots"] and errs[0]["gold"]["slots"] == errs[0]["answer"]["slots"]


def synthetic_clinc():
    """150 intents of 30 test utterances and 300 out-of-scope (CLINC150's test has 1,000). i{k} (k < 12) loses k+1
    utterances to i{k+50}; i140 loses 5 to oos; oos loses 90, 15 to each of i000..i005: more than any intent
    loses, at a lower rate."""
    intents = [f"i{k:03d}" for k in range(150)]
    gold, pred = [], []
    for k, x in enumerate(intents):
        lost = k + 1 if k < 12 else 5 if k == 140 else 0
        other = intents[k + 50] if k < 12 else "oos"
        gold += [x] * 30
        pred += [x] * (30 - lost) + [other] * lost
    gold += ["oos"] * 300
    pred += ["oos"] * 210 + [x for x in intents[:6] for _ in range(15)]
    return gold, pred, intents


def test_many_intents_view_is_the_most_confused_and_keeps_oos():
    from edgekit.reporting.confusion import OTHER, TOP_INTENTS, confusion_view

    gold, pred, intents = synthetic_clinc()
    conf = confusion_counts(gold, pred, intents + ["oos"])
    assert len(conf["labels"]) == 151
    v = confusion_view(conf, "oos")
    assert not v["full"] and len(v["rows"]) <= TOP_INTENTS + 1 and v["cols"] == v["rows"] + [OTHER]
    # by rate: i011 -> i061 (12 of 30) first; oos's pairs (15 of 300 each) come after the intents' own
    assert v["pairs"][0] == {"gold": "i011", "answered": "i061", "n": 12, "rate": 0.4}
    assert v["rows"][:2] == ["i011", "i061"] and v["rows"][-1] == "oos" and "i140" in v["rows"]
    assert "i000" not in v["rows"]
    for r in v["rates"]:  # the "other intents" column keeps each row whole
        assert sum(r) == pytest.approx(1)
    i, j = v["rows"].index("oos"), v["cols"].index("oos")
    assert v["rates"][i][j] == metrics_of(gold, pred, oos_label="oos")["oos_recall"] == 0.7
    i011 = v["rates"][0]
    assert i011[0] == pytest.approx(18 / 30) and i011[1] == pytest.approx(12 / 30)
    assert v["rates"][v["rows"].index("i140")][j] == pytest.approx(5 / 30)


def test_few_intents_view_is_the_whole_grid():
    from edgekit.reporting.confusion import confusion_view

    conf = confusion_counts(GOLD[:6], PRED[:5] + ["oos"], ["A", "B", "C", "oos"])
    v = confusion_view(conf, "oos")
    assert v["full"] and v["rows"] == v["cols"] == ["A", "B", "C", "oos"]
    assert v["rates"][0] == pytest.approx([2 / 3, 1 / 3, 0, 0]) and v["rates"][2] == pytest.approx([0, 0, 0, 1])
    assert v["rates"][3] == [None] * 4  # the runtime's oos answer, never gold: no row to normalise


def test_confusion_pictures_are_written(tmp_path):
    from matplotlib.image import imread

    from edgekit.reporting.confusion import confusion_plot

    gold, pred, intents = synthetic_clinc()
    many = confusion_plot(confusion_counts(gold, pred, intents + ["oos"]), tmp_path / "many.png", "CLINC-like", "oos")
    few = confusion_plot(confusion_counts(GOLD, PRED, ["A", "B", "C"]), tmp_path / "few.png", "few", "oos")
    h, w = imread(many).shape[:2]
    assert w > 1500 and h > 900  # the sub-grid beside the ranked pairs
    assert imread(few).shape[0] < h and not list(tmp_path.glob(".*"))  # no temp file left
