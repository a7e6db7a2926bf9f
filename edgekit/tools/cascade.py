"""The device-first cascade's calibration, for `edgekit compare`: which score the device escalates on, what counts
as a right answer, τ chosen on dev and the result on test.

- Score: `path_confidence` (schema 4 packages with slots: the intent's confidence times each word's probability
  of its decoded tag), else `confidence`. The intent's confidence alone cannot see an unsure slot, so on SNIPS a
  cascade on it escalated 1.4% of test for +0.19 slot F1 (docs/experiments.md, 2026-12-06).
- Right: exact match, the intent and every word's tag (the build's `exact_match`), when the data has slots; the
  intent alone otherwise. Counting the intent alone, a device level with the server on intents looks as good
  as the server, and τ comes out near 0 however many slots it gets wrong.
"""

from __future__ import annotations

import numpy as np

from edgekit.scoring.score import score

SCORES = ("path_confidence", "confidence")  # the device score the cascade uses: the first every answer has


def device_score(answers: list[dict]) -> str:
    """The name of the score the cascade escalates on (SCORES: the first that every answer carries)."""
    return next(s for s in SCORES if all(s in a for a in answers))


def right(examples, answers: list[dict], labels: dict) -> np.ndarray:
    """(N,) bool: exact match, the intent and every word's tag as gold (as `metrics_of`'s exact_match counts), when
    the data has slots; else the intent."""
    slots = bool(labels["slot_tags"]) and all(ex.tags is not None for ex in examples)
    return np.array([a["intent"] == ex.intent and (not slots or a.get("tags", ["O"] * len(ex.tags)) == ex.tags)
                     for a, ex in zip(answers, examples)])


def cascade_curve(conf: np.ndarray, device_ok: np.ndarray, server_ok: np.ndarray) -> list[dict]:
    """For every distinct threshold τ (escalate when the score < τ): escalation rate and cascade accuracy."""
    taus = np.unique(np.r_[0.0, conf, np.nextafter(conf.max(), 2.0) if len(conf) else 1.0])
    out = []
    for tau in taus:
        esc = conf < tau
        out.append({"threshold": float(tau), "escalation": float(esc.mean()),
                    "accuracy": float(np.where(esc, server_ok, device_ok).mean())})
    return out


def choose_threshold(curve: list[dict], server_acc: float, max_gap_pts: float) -> dict:
    """The point with the fewest escalations whose accuracy is within `max_gap_pts` of the server alone
    (escalating everything always qualifies); ties: the higher accuracy."""
    ok = [p for p in curve if p["accuracy"] >= server_acc - max_gap_pts / 100 - 1e-12]
    return min(ok, key=lambda p: (p["escalation"], -p["accuracy"]))


def expected_latency(device_ms: float, escalation: float, server_ms: float, rtt_ms: float) -> float:
    """Device latency + P(escalate) x (server latency + round trip)."""
    return device_ms + escalation * (server_ms + rtt_ms)


def calibrate(splits: dict, device: dict, server: dict, labels: dict, max_gap_pts: float) -> dict:
    """compare.json's `cascade` (less expected latency): τ chosen on dev, the cascade scored on test. splits:
    {"dev", "test"} gold examples; device, server: {"dev", "test"} answers, in the same order."""
    name = device_score(device["dev"] + device["test"])
    conf = {s: np.array([a[name] for a in device[s]]) for s in ("dev", "test")}
    ok = {side: {s: right(splits[s], res[s], labels) for s in ("dev", "test")}
          for side, res in (("device", device), ("server", server))}
    chosen = choose_threshold(cascade_curve(conf["dev"], ok["device"]["dev"], ok["server"]["dev"]),
                              float(ok["server"]["dev"].mean()), max_gap_pts)
    esc = conf["test"] < chosen["threshold"]
    mixed = [s if e else d for d, s, e in zip(device["test"], server["test"], esc)]
    slots = bool(labels["slot_tags"]) and all(ex.tags is not None for ex in splits["dev"])
    return {"threshold": chosen["threshold"], "score": name, "counts": "exact match" if slots else "intent",
            "max_gap_pts": max_gap_pts, "chosen_on": "dev",
            "dev": chosen | {"server_accuracy": float(ok["server"]["dev"].mean()),
                             "device_accuracy": float(ok["device"]["dev"].mean())},
            "test": {"escalation": float(esc.mean()), "accuracy": score(splits["test"], mixed, labels),
                     "exact": {"device": float(ok["device"]["test"].mean()),
                               "server": float(ok["server"]["test"].mean()),
                               "cascade": float(np.where(esc, ok["server"]["test"], ok["device"]["test"]).mean())}},
            "test_curve": cascade_curve(conf["test"], ok["device"]["test"], ok["server"]["test"])}
