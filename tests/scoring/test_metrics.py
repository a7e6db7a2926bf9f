import pytest

from edgekit.scoring.metrics import chunks, metrics_of, slot_f1


def test_chunks_follow_conlleval():
    assert chunks(["B-a", "I-a", "O", "B-b"]) == {("a", 0, 2), ("b", 3, 4)}
    # I- after O opens a chunk; I- of another type closes the previous one and opens its own
    assert chunks(["O", "I-a", "I-a", "I-b"]) == {("a", 1, 3), ("b", 3, 4)}
    assert chunks(["B-a", "B-a"]) == {("a", 0, 1), ("a", 1, 2)}
    assert chunks(["O", "O"]) == set()


def test_slot_f1_counts_exact_spans_only():
    gold = [["B-a", "I-a", "O", "B-b"]]
    assert slot_f1(gold, gold) == 1.0
    # one of two gold spans right, one of two predicted spans right -> P = R = 0.5
    assert slot_f1(gold, [["B-a", "O", "O", "B-b"]]) == pytest.approx(0.5)
    assert slot_f1(gold, [["O"] * 4]) == 0.0


def test_evaluate_exact_match_and_oos():
    m = metrics_of(["x", "y", "oos", "oos"], ["x", "y", "oos", "x"],
                 [["B-a"], ["O"], ["O"], ["O"]], [["B-a"], ["B-a"], ["O"], ["O"]], oos_label="oos")
    assert m["intent_acc"] == 0.75 and m["exact_match"] == 0.5
    assert m["in_scope_acc"] == 1.0 and m["oos_recall"] == 0.5
    no_slots = metrics_of(["x", "y"], ["x", "x"])
    assert no_slots["slot_f1"] is None and no_slots["exact_match"] == 0.5
