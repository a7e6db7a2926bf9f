import itertools

import numpy as np
import pytest

from edgekit.scoring.confidence import (
    auroc,
    best_threshold,
    curve,
    ece,
    fit_temperature,
    operating_point,
    scores,
    threshold_for_rate,
)


def test_fit_temperature_recovers_the_temperature_labels_were_drawn_at():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 4, (4000, 10))
    p = np.exp(z / 2.0) / np.exp(z / 2.0).sum(-1, keepdims=True)
    y = np.array([rng.choice(10, p=row) for row in p])
    assert fit_temperature(z, y) == pytest.approx(2.0, rel=0.1)
    assert fit_temperature(z / 2.0, y) == pytest.approx(1.0, rel=0.1)
    assert fit_temperature(np.vstack([z, z[:1]]), np.r_[y, -1]) == pytest.approx(fit_temperature(z, y))  # -1 skipped


def test_ece_is_zero_when_calibrated_and_the_gap_when_not():
    conf = np.full(1000, 0.8)
    correct = np.arange(1000) % 5 != 0  # 80% right
    assert ece(conf, correct) == pytest.approx(0.0, abs=1e-9)
    assert ece(np.full(1000, 0.99), correct) == pytest.approx(0.19)


def test_auroc_matches_pairwise_counting_with_ties():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 6, 40).astype(float), rng.integers(0, 4, 30).astype(float)
    pairs = [(x > y) + 0.5 * (x == y) for x, y in itertools.product(a, b)]
    assert auroc(a, b) == pytest.approx(np.mean(pairs))
    assert auroc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0


def test_scores_energy_is_temperature_times_logsumexp():
    z = np.random.default_rng(2).normal(0, 3, (50, 7))
    for t in (1.0, 0.5, 3.0):
        s = scores(z, t)
        lse = np.log(np.exp(z / t).sum(-1))
        np.testing.assert_allclose(s["energy"], t * lse, rtol=1e-10)
        np.testing.assert_allclose(s["confidence"], np.exp(z / t).max(-1) / np.exp(z / t).sum(-1), rtol=1e-10)
        assert (s["pred"] == z.argmax(-1)).all()


def test_thresholds():
    conf = np.linspace(0.01, 1.0, 100)
    assert threshold_for_rate(conf, 0.05) == pytest.approx(np.quantile(conf, 0.05))
    assert (conf < threshold_for_rate(conf, 0.05)).mean() == pytest.approx(0.05, abs=0.011)
    assert threshold_for_rate(conf, 0.0) is None
    with pytest.raises(ValueError):
        threshold_for_rate(conf, 1.5)
    # Out-of-scope utterances score low here: the best threshold separates them.
    rng = np.random.default_rng(0)
    c = np.concatenate([rng.uniform(0.6, 1.0, 90), rng.uniform(0.1, 0.5, 10)])
    is_oos = np.arange(100) >= 90
    tau, figs = best_threshold(c, ~is_oos, np.zeros(100, bool), is_oos, 0.02)
    assert 0.5 < tau <= c[:90].min() and figs == {"in_scope_acc": 1.0, "oos_recall": 1.0, "refused_in_scope": 0.0}
    # Overlapping scores: the accuracy budget binds, and a looser one buys recall.
    c2 = np.concatenate([rng.uniform(0.3, 1.0, 90), rng.uniform(0.0, 0.7, 10)])
    tight, loose = (best_threshold(c2, ~is_oos, np.zeros(100, bool), is_oos, d)[1] for d in (0.01, 0.1))
    assert tight["in_scope_acc"] >= 0.99 - 1e-9 and loose["in_scope_acc"] >= 0.9 - 1e-9
    assert loose["oos_recall"] > tight["oos_recall"]
    # Nothing to gain: no threshold.
    assert best_threshold(c, ~is_oos, np.zeros(100, bool), np.zeros(100, bool), 0.02)[0] is None


def test_best_threshold_matches_trying_every_threshold_one_by_one():
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(20, 200))
        is_oos = rng.uniform(size=n) < 0.3
        score = np.round(np.where(is_oos, rng.normal(0, 1, n), rng.normal(1.5, 1, n)), 1)  # ties on purpose
        pred_oos = rng.uniform(size=n) < 0.1
        correct = ~is_oos & (rng.uniform(size=n) < 0.9)
        drop = float(rng.choice([0.0, 0.01, 0.05]))
        floor = operating_point(score, correct, pred_oos, is_oos, -np.inf)["in_scope_acc"] - drop
        best, want = (-1.0, -1.0), None
        for t in np.unique(score):
            f = operating_point(score, correct, pred_oos, is_oos, t)
            if f["in_scope_acc"] >= floor - 1e-12 and (f["oos_recall"], f["in_scope_acc"]) > best:
                best, want = (f["oos_recall"], f["in_scope_acc"]), float(t)
        assert best_threshold(score, correct, pred_oos, is_oos, drop)[0] == want


def test_curve_starts_unthresholded_and_trades_accuracy_for_recall():
    rng = np.random.default_rng(3)
    s = np.r_[rng.normal(2, 1, 300), rng.normal(0, 1, 100)]
    is_oos = np.arange(400) >= 300
    correct = ~is_oos & (rng.uniform(size=400) < 0.95)
    pts = curve(s, correct, np.zeros(400, bool), is_oos)
    assert pts[0]["threshold"] is None and pts[0] == {"threshold": None} | operating_point(
        s, correct, np.zeros(400, bool), is_oos, -np.inf)
    rec = [p["oos_recall"] for p in pts]
    acc = [p["in_scope_acc"] for p in pts]
    assert rec == sorted(rec) and acc == sorted(acc, reverse=True) and rec[-1] > 0.8
