"""Confidence that means something: temperature scaling, calibration error, out-of-scope scores and curves.

All numpy, on intent logits (N, I) that already carry the decoding graph's mask (blocked intents at a large
negative value), so that what is measured here is what the graph computes.

Two scores can refuse an utterance (`SCORES`): the graph's confidence (the top probability after temperature
scaling) and the energy, `T * logsumexp(logits / T)`, which does not saturate: a softmax that puts 0.9998 on
almost every in-scope utterance still has logits of very different size. On CLINC150 (student, test) energy
separates out-of-scope from in-scope with AUROC 0.973 against 0.963 for the calibrated confidence
(docs/experiments.md, 2026-12-01).
"""

from __future__ import annotations

import numpy as np

SCORES = ("confidence", "energy")


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def nll(z: np.ndarray, y: np.ndarray, t: float) -> float:
    """Mean negative log-likelihood of gold ids `y` (N,) under softmax(z / t)."""
    return float(-log_softmax(z / t)[np.arange(len(y)), y].mean())


def fit_temperature(z: np.ndarray, y: np.ndarray, lo: float = 0.05, hi: float = 20.0) -> float:
    """The one scalar T that minimises dev NLL of softmax(z / T) (golden-section search on log T; the NLL is
    unimodal in T). Rows whose gold id is outside the logits (-1: unseen labels) are skipped."""
    keep = (y >= 0) & (y < z.shape[1])
    z, y = z[keep].astype(np.float64), y[keep]
    a, b = np.log(lo), np.log(hi)
    g = (np.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(z, y, np.exp(c)), nll(z, y, np.exp(d))
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(z, y, np.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(z, y, np.exp(d))
    return float(np.exp((a + b) / 2))


def scores(z: np.ndarray, t: float = 1.0) -> dict[str, np.ndarray]:
    """Per utterance: the argmax id, the confidence (top probability of softmax(z / t)) and the energy
    t * logsumexp(z / t), computed as the graph does (logsumexp = top scaled logit - log confidence)."""
    z = z.astype(np.float64) / t
    pred = z.argmax(-1)
    logp = log_softmax(z)[np.arange(len(z)), pred]
    return {"pred": pred, "confidence": np.exp(logp), "energy": t * (z[np.arange(len(z)), pred] - logp)}


def ece(conf: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error: the gap between confidence and accuracy, averaged over equal-width bins."""
    conf, correct = np.asarray(conf, np.float64), np.asarray(correct, np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    total = 0.0
    for k in range(bins):
        m = which == k
        if m.any():
            total += m.mean() * abs(conf[m].mean() - correct[m].mean())
    return float(total)


def auroc(in_scope: np.ndarray, out_of_scope: np.ndarray) -> float:
    """P(score of an in-scope utterance > score of an out-of-scope one), ties counted half (Mann-Whitney)."""
    s = np.concatenate([in_scope, out_of_scope])
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inv]  # 1-based, ties share their average rank
    n, m = len(in_scope), len(out_of_scope)
    return float((ranks[:n].sum() - n * (n + 1) / 2) / (n * m))


def operating_point(score: np.ndarray, correct: np.ndarray, pred_oos: np.ndarray, is_oos: np.ndarray,
                    tau: float) -> dict:
    """In-scope accuracy (right and not refused), out-of-scope recall and the share of in-scope refused when
    utterances scoring below `tau` are refused (the argmax already answering the oos class counts as refused)."""
    refuse = pred_oos | (score < tau)
    ins = ~is_oos
    return {"in_scope_acc": float((correct & ~refuse)[ins].mean()) if ins.any() else None,
            "oos_recall": float(refuse[is_oos].mean()) if is_oos.any() else None,
            "refused_in_scope": float(refuse[ins].mean()) if ins.any() else None}


def threshold_for_rate(score_in_scope: np.ndarray, rate: float) -> float | None:
    """The score below which `rate` of the in-scope utterances fall (they would be refused); None for rate 0."""
    if not 0 <= rate < 1:
        raise ValueError(f"--oos-far must be in [0, 1), got {rate}")
    return float(np.quantile(score_in_scope, rate)) if rate > 0 else None


def best_threshold(score: np.ndarray, correct: np.ndarray, pred_oos: np.ndarray, is_oos: np.ndarray,
                   max_drop: float) -> tuple[float, dict]:
    """The threshold (on labelled data, dev) that catches the most out-of-scope utterances while in-scope
    accuracy stays within `max_drop` (a fraction) of its value without one; ties: the higher in-scope accuracy.
    None when no threshold helps (nothing refused beyond the oos class)."""
    floor = operating_point(score, correct, pred_oos, is_oos, -np.inf)["in_scope_acc"] - max_drop
    tau = None
    if is_oos.any():
        # Every distinct score as a threshold at once (sorted counts, not a pass over the data per threshold):
        # in-scope rows kept right = those right, not answered oos, scoring >= t; out-of-scope rows refused =
        # those answered oos plus the rest scoring < t.
        ts = np.unique(score)
        kept = np.sort(score[correct & ~pred_oos & ~is_oos])
        missed = np.sort(score[is_oos & ~pred_oos])
        acc = (len(kept) - np.searchsorted(kept, ts, "left")) / np.count_nonzero(~is_oos)
        rec = (np.count_nonzero(is_oos & pred_oos) + np.searchsorted(missed, ts, "left")) / np.count_nonzero(is_oos)
        ok = np.flatnonzero(acc >= floor - 1e-12)
        if len(ok):  # the most recall, then the most accuracy, then the lowest threshold
            tau = float(ts[ok[np.lexsort((ok, -acc[ok], -rec[ok]))[0]]])
    return tau, operating_point(score, correct, pred_oos, is_oos, -np.inf if tau is None else tau)


def curve(score: np.ndarray, correct: np.ndarray, pred_oos: np.ndarray, is_oos: np.ndarray,
          points: int = 41) -> list[dict]:
    """In-scope accuracy against out-of-scope recall as the threshold sweeps the score's quantiles."""
    taus = np.unique(np.quantile(score, np.linspace(0.0, 0.4, points)))
    return [{"threshold": None} | operating_point(score, correct, pred_oos, is_oos, -np.inf)] + [
        {"threshold": float(t)} | operating_point(score, correct, pred_oos, is_oos, float(t)) for t in taus]
