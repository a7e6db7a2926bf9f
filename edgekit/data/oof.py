"""Out-of-fold probabilities for the label-issues search (edgekit.data.label_issues): the folds, the two cheap
models, which rows a fold cannot judge, and a cache of the probabilities.

The fit is the search's cost once its features are cached (SNIPS: 38 s of 50-60 s at one thread). Its probabilities
depend on the features, the labels as class ids, the folds and the fit's settings alone, so they are kept under that
key beside the features: an identical second run skips the fit, and a run after any label is fixed fits again.
numpy here; sklearn loads inside the functions. `cfg` is a LabelIssuesConfig.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgekit.io import atomic_path

log = logging.getLogger("edgekit")
OOF_VERSION = 1  # bump when what a kept probability file holds, or how it is fitted, changes
# the settings each kind's fit reads: with the features, the labels and the folds, they decide its probabilities
FIT_SETTINGS = {"intent": ("seed", "l2"), "slots": ("seed", "slot_hidden", "slot_steps", "slot_alpha", "context")}


def fold_of(labels: list[int], folds: int, seed: int, groups: list | None = None) -> np.ndarray:
    """(N,) each utterance's fold, stratified by `labels` (its intent); a slot token takes its utterance's fold, so
    the folds are grouped by utterance. Rows of one group (`groups`: the same text as the encoder reads it) share
    the fold of the group's first row: a copy of a row in the training folds would vouch for its label."""
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(labels)
    k = max(2, min(folds, len(y)))
    out = np.zeros(len(y), np.int64)
    # StratifiedKFold needs each class in >= k rows; a rarer class's rows are dealt to consecutive folds, one each
    rare = np.bincount(y)[y] < k
    if (~rare).sum() >= k:
        common = np.flatnonzero(~rare)
        skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(common, y[common])
        for f, (_, test) in enumerate(skf):
            out[common[test]] = f
    few = np.flatnonzero(rare)[np.argsort(y[rare], kind="stable")]
    out[few] = (np.arange(len(few)) + seed) % k
    if groups is not None:
        _, first, inverse = np.unique(np.asarray(groups, dtype=object), return_index=True, return_inverse=True)
        out = out[first[inverse]]
    return out


def oof_probs(X: np.ndarray, y: np.ndarray, n_classes: int, fold: np.ndarray, make) -> np.ndarray:
    """(N, n_classes) probabilities for each row from the classifier `make(training rows)` fitted on the other
    folds; a class absent from a fold's training rows gets probability 0 there. The features are standardised once
    over all rows: that uses no label, and a scaler per fold cost SNIPS 13 s of the words' fit."""
    from threadpoolctl import threadpool_limits

    X = X - X.mean(0)  # a copy: the caller's features stay as they are
    X /= X.std(0) + 1e-6
    out = np.full((len(y), n_classes), 1.0 / n_classes)  # a fold with one class to learn from stays uniform
    # One BLAS thread: threads spinning against any other load on a 2-core machine made a fit 10x slower.
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the MLP's few passes end before it "converges": by design
        for f in np.unique(fold):
            test, train = fold == f, fold != f
            if len(np.unique(y[train])) < 2:
                continue
            clf = make(int(train.sum())).fit(X[train], y[train])
            out[test] = 0.0
            out[np.ix_(test, clf.classes_)] = clf.predict_proba(X[test])
    return out


def intent_model(cfg, n: int):
    """Logistic regression on the utterance vector: a few hundred dimensions, a few classes, seconds."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=1.0 / (2 * cfg.l2 * n), max_iter=300, random_state=cfg.seed)


def slot_model(cfg, n: int):
    """A one-hidden-layer MLP, a few passes of Adam: on SNIPS (117,700 words x 1,536 features x 76 tags) it tagged
    as well as a logistic regression run to convergence (92.6% against 92.7% of words out of fold, last-layer
    words) in a twentieth of the time."""
    from sklearn.neural_network import MLPClassifier

    passes = -(-cfg.slot_steps // -(-n // 256))  # ceil(steps / batches a pass)
    return MLPClassifier((cfg.slot_hidden,), alpha=cfg.slot_alpha, batch_size=256, max_iter=passes,
                         random_state=cfg.seed)


def word_matrix(feats, context: int) -> np.ndarray:
    """(W, H * (2 * context + 2)): each word's vector, its neighbours' within `context` words (zeros past the
    utterance's ends: the padding says where an utterance starts and ends) and its utterance's vector."""
    W, H = feats.words.shape
    utt_of = np.repeat(np.arange(len(feats.offsets) - 1), np.diff(feats.offsets))  # (W,)
    pos = np.arange(W) - feats.offsets[utt_of]  # (W,) word number within its utterance
    n = np.diff(feats.offsets)[utt_of]  # (W,) words in its utterance
    parts = [feats.words]
    for d in [d for k in range(1, context + 1) for d in (-k, k)]:
        inside = (pos + d >= 0) & (pos + d < n)
        shifted = np.zeros_like(feats.words)
        shifted[inside] = feats.words[np.arange(W)[inside] + d]
        parts.append(shifted)
    parts.append(feats.utterance[utt_of])
    return np.concatenate(parts, axis=1)


def unjudged(probs: np.ndarray, y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """(N,) rows whose label no training row of their fold carries (an intent seen once, a tag whose utterances all
    fell in one fold): no model out of sample can have learnt it, so their probabilities become their given label's
    and cleanlab takes them as given. Changes `probs` in place."""
    present = np.zeros((int(fold.max(initial=0)) + 1, probs.shape[1]), bool)  # (folds, classes)
    for f in np.unique(fold):
        present[f, np.unique(y[fold != f])] = True
    lone = ~present[fold, y]
    probs[lone] = 0.0
    probs[lone, y[lone]] = 1.0
    return lone


@dataclass
class ProbCache:
    """Out-of-fold probabilities kept in `folder` (None: not kept) for features whose cache key is `features`."""

    folder: Path | None
    features: str

    def key(self, kind: str, y: np.ndarray, fold: np.ndarray, n_classes: int, cfg) -> str:
        """The probabilities' key: everything the fit reads (the features by their key, the labels as class ids,
        the folds, the fit's settings) and the scikit-learn that fits them."""
        from importlib.metadata import version

        h = hashlib.sha256(json.dumps({"features": self.features, "kind": kind, "classes": n_classes,
                                       "fit": {k: getattr(cfg, k) for k in FIT_SETTINGS[kind]},
                                       "sklearn": version("scikit-learn"), "version": OOF_VERSION},
                                      sort_keys=True).encode())
        h.update(np.ascontiguousarray(y, np.int64).tobytes())
        h.update(np.ascontiguousarray(fold, np.int64).tobytes())
        return h.hexdigest()[:32]

    def probs(self, kind: str, X: Callable[[], np.ndarray], y: np.ndarray, n_classes: int, fold: np.ndarray, cfg,
              make) -> tuple[np.ndarray, bool]:
        """((N, n_classes) probabilities, whether they were read back): oof_probs(X(), ...) rounded to float32,
        which is how they are kept, so a first run and a second give the same ranking. X is called on a miss only
        (the words' matrix is the search's largest allocation)."""
        name = f"oof-{kind}-{self.key(kind, y, fold, n_classes, cfg)}.npy"
        path = None if self.folder is None else Path(self.folder) / name
        if path is not None and path.is_file():
            try:
                p = np.load(path, allow_pickle=False)
                if p.shape == (len(y), n_classes) and p.dtype == np.float32:
                    return p.astype(np.float64), True
                log.warning("%s: not the probabilities expected; fitting again", path)
            except (OSError, ValueError) as e:  # a truncated or foreign file
                log.warning("%s: unreadable (%s); fitting again", path, e)
        p = oof_probs(X(), y, n_classes, fold, make).astype(np.float32)
        if path is not None:
            try:
                with atomic_path(path) as tmp, open(tmp, "wb") as f:
                    np.save(f, p, allow_pickle=False)
            except OSError as e:  # not kept costs the next run the fit, not this run its answer
                log.warning("%s: cannot keep the probabilities (%s)", path, e.strerror or e)
        return p.astype(np.float64), False
