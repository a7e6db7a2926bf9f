"""The cascade's arithmetic and the runtime's fallback settings (no server here: tests/serve/test_serve.py runs them
against a real one)."""

import numpy as np
import pytest

from edgekit.runtime.cascade import Fallback
from edgekit.tools.cascade import cascade_curve, choose_threshold, expected_latency


def test_cascade_curve_and_the_chosen_threshold():
    conf = np.array([0.2, 0.5, 0.6, 0.9, 0.95, 0.99])
    device_ok = np.array([False, False, True, True, True, True])
    server_ok = np.array([True, True, True, True, False, True])
    curve = cascade_curve(conf, device_ok, server_ok)
    assert curve[0] == {"threshold": 0.0, "escalation": 0.0, "accuracy": 4 / 6}  # device alone
    assert curve[-1]["escalation"] == 1.0 and curve[-1]["accuracy"] == 5 / 6  # server alone
    by_tau = {round(p["threshold"], 2): p for p in curve}
    assert by_tau[0.6] == {"threshold": 0.6, "escalation": 2 / 6, "accuracy": 1.0}  # the two unsure ones escalate
    # within 0.1 pt of the server alone (83.3%): the fewest escalations reaching it is 0.5 (1 escalated, 5/6)
    pick = choose_threshold(curve, server_acc=5 / 6, max_gap_pts=0.1)
    assert pick["threshold"] == 0.5 and pick["escalation"] == 1 / 6 and pick["accuracy"] == 5 / 6
    # a gap of 20 points accepts the device alone
    assert choose_threshold(curve, server_acc=5 / 6, max_gap_pts=20)["escalation"] == 0.0


def test_expected_latency_is_device_plus_the_escalated_share_of_server_and_round_trip():
    assert expected_latency(1.0, 0.0, 20.0, 55.0) == 1.0
    assert expected_latency(1.0, 0.1, 20.0, 55.0) == pytest.approx(1.0 + 7.5)


@pytest.mark.parametrize("kw", [{"url": "ftp://x"}, {"threshold": 1.5}, {"threshold": float("nan")},
                                {"timeout_s": 0.0}])
def test_fallback_settings_are_checked(kw):
    with pytest.raises(ValueError):
        Fallback(**({"url": "http://127.0.0.1:1", "threshold": 0.5} | kw))


def test_a_confident_device_answer_never_calls_the_server():
    fb = Fallback("http://127.0.0.1:9", 0.5, 0.2)  # port 9: nothing listens; it must not be asked anyway
    device = {"intent": "play", "confidence": 0.9, "slots": []}
    assert fb.answer(device, "play", None, True) == device | {"escalated": False}
    unsure = {"intent": "play", "confidence": 0.3, "slots": []}
    assert fb.answer(unsure, "play", None, True) == unsure | {"escalated": False, "fallback": "unreachable"}


def test_a_reply_that_is_not_http_keeps_the_device_answer():
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def garbage():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"\x00\x01 not http at all\r\n\r\n")
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    fb = Fallback(f"http://127.0.0.1:{srv.getsockname()[1]}", 0.5, 2.0)
    unsure = {"intent": "play", "confidence": 0.3, "slots": []}
    assert fb.answer(unsure, "play", None, True) == unsure | {"escalated": False, "fallback": "unreachable"}
    srv.close()


def test_a_path_score_cascade_escalates_on_an_unsure_slot_and_a_schema_3_answer_on_its_confidence():
    fb = Fallback("http://127.0.0.1:9", 0.5, 0.2, score="path_confidence")  # port 9: nothing listens
    sure_intent_unsure_slot = {"intent": "play", "confidence": 0.95, "path_confidence": 0.3, "slots": []}
    assert fb.answer(sure_intent_unsure_slot, "play", None, True)["fallback"] == "unreachable"  # it asked
    sure = {"intent": "play", "confidence": 0.3, "path_confidence": 0.6, "slots": []}  # the score, not confidence
    assert fb.answer(sure, "play", None, True) == sure | {"escalated": False}  # it did not ask
    three = Fallback("http://127.0.0.1:9", 0.5, 0.2)  # a schema 3 package: its confidence is the score
    assert three.answer({"intent": "play", "confidence": 0.3, "slots": []}, "play", None, True)["fallback"] \
        == "unreachable"
    with pytest.raises(ValueError, match="cascade score"):
        Fallback("http://127.0.0.1:9", 0.5, score="energy")


def _ex(words, intent, tags):
    from edgekit.data.formats import Example

    return Example(words.split(), intent, tags.split())


def test_exact_match_counts_slots_and_calibration_escalates_what_the_intent_alone_cannot_see():
    from edgekit.tools.cascade import calibrate, device_score, right

    labels = {"intents": ["play", "stop"], "slot_tags": ["O", "B-a", "I-a"], "oos_label": None}
    gold = [_ex("play x y", "play", "O B-a I-a"), _ex("stop now", "stop", "O O")] * 5
    # exact match as the build report counts it: the intent and every word's tag
    assert right(gold[:2], [{"intent": "play", "tags": ["O", "B-a", "I-a"]}, {"intent": "play", "tags": ["O", "O"]}],
                 labels).tolist() == [True, False]
    assert right(gold[:1], [{"intent": "play", "tags": ["O", "B-a", "O"]}], labels).tolist() == [False]
    assert right(gold[:1], [{"intent": "play", "tags": ["O", "B-a", "O"]}],
                 labels | {"slot_tags": []}).tolist() == [True]  # no slots in the data: the intent alone
    # the device gets every intent right but the first utterance's slot wrong each time, with a low path score
    device, server = [], []
    for k, ex in enumerate(gold):
        wrong = k % 2 == 0
        tags = ["O", "B-a", "O"] if wrong else ex.tags
        device.append({"intent": ex.intent, "tags": tags, "confidence": 0.99, "path_confidence": 0.2 if wrong else 0.9})
        server.append({"intent": ex.intent, "tags": list(ex.tags), "confidence": 0.99})
    assert device_score(device) == "path_confidence" and device_score(server) == "confidence"
    splits = {"dev": gold, "test": gold}
    c = calibrate(splits, {"dev": device, "test": device}, {"dev": server, "test": server}, labels, 0.1)
    assert (c["score"], c["counts"]) == ("path_confidence", "exact match")
    assert c["test"]["escalation"] == 0.5 and c["test"]["exact"] == {"device": 0.5, "server": 1.0, "cascade": 1.0}
    assert c["test"]["accuracy"]["slot_f1"] == 1.0
    # the same answers without path_confidence: the confidence cannot tell them apart, so τ escalates all or none
    plain = [{k: v for k, v in a.items() if k != "path_confidence"} for a in device]
    c = calibrate(splits, {"dev": plain, "test": plain}, {"dev": server, "test": server}, labels, 0.1)
    assert c["score"] == "confidence" and c["test"]["escalation"] in (0.0, 1.0)
