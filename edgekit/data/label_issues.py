"""Suspected label errors: cleanlab on out-of-sample probabilities from the base encoder's frozen features.

The pretrained encoder (no fine-tuning, eval mode) gives each utterance a vector (the mean of its last hidden
state) and each word one (the mean of its pieces in a middle layer). Cheap models learn the labels in k folds, so
every row's probabilities come from a model that never saw it: a logistic regression for intents, a
one-hidden-layer MLP for a word's tag from its vector, its neighbours' and the utterance's. cleanlab then ranks the
rows whose label those probabilities doubt: `cleanlab.filter` / `cleanlab.rank` for intents,
`cleanlab.token_classification` for slot tags. Features depend on the texts only, so they are cached (under the
stage cache's features/): a copy of the data with other labels costs the fit alone. The fit's out-of-fold
probabilities are kept beside them by features, labels and settings (edgekit.data.oof), so an identical second run
costs cleanlab's ranking alone. torch, sklearn and cleanlab load inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgekit.data.oof import (  # noqa: F401 (fold_of, oof_probs: this module's public names before the split)
    ProbCache,
    fold_of,
    intent_model,
    oof_probs,
    slot_model,
    unjudged,
    word_matrix,
)
from edgekit.errors import EdgekitError
from edgekit.io import atomic_path
from edgekit.scoring.metrics import chunks

log = logging.getLogger("edgekit")
FEATURES_VERSION = 2  # bump when what a cached feature file holds changes


# each integer setting's bounds, both included
INT_RANGES = {"folds": (2, 100), "seed": (0, 2**32 - 1), "max_len": (4, 4096), "word_layer": (-64, -1),
              "batch_size": (1, 4096), "threads": (0, 1024), "slot_hidden": (1, 4096), "slot_steps": (1, 10**6),
              "context": (0, 3)}


@dataclass
class LabelIssuesConfig:
    """Hyperparameters of the search; JSON-serialisable (asdict)."""

    folds: int = 5  # k of the k-fold out-of-sample probabilities
    seed: int = 0  # fold assignment and the classifier's
    base_model: str = "minilm"  # a --base-model name or folder: whose frozen features
    max_len: int = 64  # pieces per utterance, [CLS] and [SEP] included; words past it are not judged
    # the hidden state a word's vector comes from, counted from the last (-1); the utterance's is always the last.
    # A middle layer tags better: on 3,300 SNIPS rows layer 4 of MiniLM's 6 gave 91.1% of words, the last 88.3%
    word_layer: int = -3
    batch_size: int = 64  # utterances per encoder call
    threads: int = 0  # the encoder's torch threads, 0: torch's default; 1 beside another job (3x faster on 2 cores)
    # the intent logistic regression's L2 strength per training row: sklearn's C = 1 / (2 * l2 * rows), so a small
    # dataset is not regularised harder than a large one. SNIPS: 0.0016 to 0.016 found 80-81% of planted flips
    l2: float = 0.005
    slot_hidden: int = 128  # the slot MLP's hidden units
    slot_steps: int = 600  # and its Adam steps of 256 words, in whole passes (SNIPS: 2 passes; a few words: many)
    slot_alpha: float = 1e-3  # and its L2 strength
    context: int = 1  # a word's features: its vector, its neighbours' within this many words, the utterance's
    slots: bool = True  # judge the slot tags too (where the data has them)

    def __post_init__(self):
        for name, (low, high) in INT_RANGES.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
        for name in ("l2", "slot_alpha"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        if not isinstance(self.slots, bool):
            raise ValueError(f"slots must be true or false, got {self.slots!r}")
        if not isinstance(self.base_model, str) or not self.base_model:
            raise ValueError("base_model must name a base model or a folder")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Features:
    """Frozen encoder features: utterance i's words are rows offsets[i]:offsets[i + 1] of `words`."""

    utterance: np.ndarray  # (N, H) mean of the last hidden state over the utterance's pieces
    words: np.ndarray  # (W, H) mean of each kept word's pieces
    offsets: np.ndarray  # (N + 1,) int64

    def n_words(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])


def encode_features(texts: list[str], folder: Path, max_len: int, batch_size: int = 64, word_layer: int = -1,
                    progress: bool = False, threads: int = 0) -> Features:
    """The base model's frozen features of `texts` (eval mode, no gradients, length-sorted batches): utterance
    vectors from the last hidden state, word vectors from hidden state `word_layer` (-1: the last)."""
    import torch
    from tqdm import tqdm

    from edgekit.modeling.pretrained import load_pretrained, specials
    from edgekit.text.wordpiece import WordPieceTokenizer

    tok = WordPieceTokenizer.from_file(Path(folder) / "vocab.txt", specials=specials(folder))
    model = load_pretrained(folder, 1, 0, dropout=0.0).eval()  # heads unused: states only
    if -word_layer > model.cfg.layers + 1:  # the embeddings and each layer's output
        raise EdgekitError(f"label issues: word_layer {word_layer}, but {folder} has {model.cfg.layers} layers")
    encs = [tok.encode(t, max_len) for t in texts]
    lengths = [sum(e.attention_mask) for e in encs]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    utt, words = [None] * len(texts), [None] * len(texts)
    bar = tqdm(total=len(texts), desc="features", unit="utt", disable=not progress, mininterval=1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s:s + batch_size]
                T = max(lengths[i] for i in idx)
                ids = torch.tensor([encs[i].input_ids[:T] for i in idx])  # (B, T)
                mask = torch.tensor([encs[i].attention_mask[:T] for i in idx])  # (B, T)
                states = model.encode(ids, mask)
                h, hw = states[-1].float(), states[word_layer].float()  # (B, T, H) each
                m = mask[..., None].float()  # (B, T, 1)
                pooled = ((h * m).sum(1) / m.sum(1)).numpy()  # (B, H)
                for b, i in enumerate(idx):
                    n = lengths[i]
                    utt[i] = pooled[b]
                    words[i] = _word_means(hw[b, :n].numpy(), encs[i].word_index[:n], encs[i].n_words_kept)
                bar.update(len(idx))
    finally:
        torch.set_num_threads(before)
        bar.close()
    H = model.cfg.hidden
    counts = np.array([len(w) for w in words], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = np.concatenate(words) if counts.sum() else np.zeros((0, H), np.float32)
    return Features(np.stack(utt).astype(np.float32) if utt else np.zeros((0, H), np.float32),
                    flat.astype(np.float32), offsets)


def _word_means(h: np.ndarray, word_index: list[int], kept: int) -> np.ndarray:
    """(kept, H) from h (n, H), one utterance unpadded: each word's mean over its pieces. Between [CLS] and [SEP]
    a piece with word_index -1 continues the word before it."""
    out, n, w = np.zeros((kept, h.shape[1]), np.float32), np.zeros(kept), -1
    for t in range(1, len(word_index) - 1):
        w = word_index[t] if word_index[t] >= 0 else w
        out[w] += h[t]
        n[w] += 1
    return out / np.maximum(n, 1)[:, None]


def features_key(texts: list[str], folder: Path, max_len: int, word_layer: int = -1) -> str:
    """The cache key: the base model's config, vocabulary and weights (their bytes: another checkpoint at the same
    path is another key), the texts (labels play no part), max_len, word_layer and FEATURES_VERSION."""
    from edgekit.engine.cache import digest_files  # a leaf of edgekit's (no torch): the build's own file digest

    model = digest_files([Path(folder) / n for n in ("config.json", "vocab.txt", "model.safetensors")])
    h = hashlib.sha256(json.dumps({"model": model, "max_len": max_len, "word_layer": word_layer,
                                   "version": FEATURES_VERSION}).encode())
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def cached_features(texts: list[str], folder: Path, cfg: LabelIssuesConfig, cache_dir: Path | None,
                    progress: bool = False) -> tuple[Features, dict]:
    """Features from `cache_dir`/<key>.safetensors, else computed and stored there (atomically). Returns them and
    {"key", "cached" (bool), "seconds", "path"}."""
    from safetensors.numpy import load_file, save_file

    t0 = time.perf_counter()
    key = features_key(texts, folder, cfg.max_len, cfg.word_layer)
    path = Path(cache_dir) / f"{key[:32]}.safetensors" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            t = load_file(str(path))
            feats = Features(t["utterance"], t["words"].astype(np.float32), t["offsets"])
            if len(feats.offsets) == len(texts) + 1:
                return feats, {"key": key[:32], "cached": True, "seconds": time.perf_counter() - t0, "path": str(path)}
        except Exception as e:  # safetensors raises its own error on a damaged file
            log.warning("%s: unreadable (%s); computing the features again", path, e)
    feats = encode_features(texts, folder, cfg.max_len, cfg.batch_size, cfg.word_layer, progress, cfg.threads)
    # words kept in float16 (SNIPS: 90 MB, half), rounded here too: a run that reads them finds the same rows
    feats.words = feats.words.astype(np.float16).astype(np.float32)
    try:
        if path is not None:
            with atomic_path(path) as tmp:
                save_file({"utterance": feats.utterance, "words": feats.words.astype(np.float16),
                           "offsets": feats.offsets}, str(tmp))
    except OSError as e:  # a cache that cannot be written costs the next run the features, not this run its answer
        log.warning("%s: cannot keep the features (%s)", path, e.strerror or e)
    return feats, {"key": key[:32], "cached": False, "seconds": time.perf_counter() - t0,
                   "path": str(path) if path else None}


def intent_issues(X: np.ndarray, intents: list[str], fold: np.ndarray, cfg: LabelIssuesConfig,
                  store: ProbCache | None = None) -> tuple[list, dict]:
    """Rows [(index, label, suggested, score)] cleanlab flags, most suspect first, and the search's figures.
    `store`: where the out-of-fold probabilities are kept between runs (None: fitted every time)."""
    import cleanlab

    names, y = np.unique(np.array(intents, dtype=object), return_inverse=True)  # sorted names, (N,) ids
    store = store or ProbCache(None, "")
    probs, kept = store.probs("intent", lambda: X, y, len(names), fold, cfg, lambda n: intent_model(cfg, n))
    lone = unjudged(probs, y, fold)
    accuracy = float((probs.argmax(1) == y).mean()) if len(y) else 0.0
    with warnings.catch_warnings():  # "too few examples" of a class to prune by: its rows are still ranked
        warnings.simplefilter("ignore", UserWarning)
        flagged = cleanlab.filter.find_label_issues(y, probs, return_indices_ranked_by="self_confidence", n_jobs=1)
    scores = cleanlab.rank.get_label_quality_scores(y, probs, method="self_confidence")
    rows = [(int(i), names[y[i]], names[int(probs[i].argmax())], float(scores[i])) for i in flagged]
    return rows, {"rows": len(y), "flagged": len(rows), "unjudged": int(lone.sum()), "oof_accuracy": accuracy,
                  "fit_reused": kept}


def slot_issues(feats: Features, tags: list[list[str]], fold: np.ndarray, cfg: LabelIssuesConfig,
                store: ProbCache | None = None) -> tuple[list, dict]:
    """Rows [(index, suspect words, suggested tags, score)] of utterances where cleanlab flags a word's tag, most
    suspect first (the utterance's lowest word score), and the search's figures. `tags`: each utterance's given
    tags of its kept words; `store` as intent_issues'."""
    from cleanlab.token_classification import filter as token_filter
    from cleanlab.token_classification import rank as token_rank

    names, y = np.unique(np.array([t for ts in tags for t in ts], dtype=object), return_inverse=True)  # (W,) ids
    utt_of = np.repeat(np.arange(len(tags)), [len(ts) for ts in tags])  # (W,)
    store = store or ProbCache(None, "")
    probs, kept = store.probs("slots", lambda: word_matrix(feats, cfg.context), y, len(names), fold[utt_of], cfg,
                              lambda n: slot_model(cfg, n))
    lone = unjudged(probs, y, fold[utt_of])
    accuracy = float((probs.argmax(1) == y).mean()) if len(y) else 0.0
    judged = [i for i, ts in enumerate(tags) if ts]  # an utterance with no kept word has nothing to judge
    cut = np.split(np.arange(len(y)), np.cumsum([len(ts) for ts in tags])[:-1])
    labels = [y[cut[i]].tolist() for i in judged]
    pp = [probs[cut[i]] for i in judged]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        issues = token_filter.find_label_issues(labels, pp, n_jobs=1) if labels else []
    sentence, _ = token_rank.get_label_quality_scores(labels, pp) if labels else (np.zeros(0), [])
    suspect: dict[int, list[int]] = {}
    for s, w in issues:
        suspect.setdefault(s, []).append(int(w))
    rows = []
    for s in sorted(suspect, key=lambda s: (sentence[s], s)):
        i = judged[s]
        suggested = list(tags[i])
        for w in suspect[s]:
            suggested[w] = names[int(pp[s][w].argmax())]
        rows.append((i, sorted(suspect[s]), suggested, float(sentence[s])))
    return rows, {"rows": len(judged), "words": len(y), "flagged": len(rows), "flagged_words": len(issues),
                  "unjudged_words": int(lone.sum()), "oof_accuracy": accuracy, "fit_reused": kept}


def _spans(tags: list[str], words: list[str]) -> list[dict]:
    """A row's slot spans as the scorer reads BIO (conlleval's chunks), in word order; end exclusive."""
    return [{"slot": t, "start": a, "end": b, "words": " ".join(words[a:b])} for t, a, b in sorted(
        chunks(tags), key=lambda c: (c[1], c[2]))]


def model_text(ex) -> str:
    """The utterance as the uncased tokenizer reads it (case, accents, spaces, punctuation spacing folded; as
    `edgekit data check` finds near-duplicates): copies under this text are one input to the model."""
    from edgekit.data.check import read_as_model

    return " ".join(w for w in read_as_model(ex.words) if w)


def _where(ex, i: int) -> dict:
    return {"index": i, "file": ex.file, "line": ex.line, "text": ex.text}


def issues_from_features(examples: list, feats: Features, cfg: LabelIssuesConfig,
                         store: ProbCache | None = None) -> tuple[list[dict], dict]:
    """The ranked rows and the fit's figures from features already made (find_label_issues without the encoder).

    Intent rows: label (the given intent), suggested (the intent the model prefers). Slot rows: label and
    suggested as spans ({slot, start, end, words}; suggested: the given tags with each suspect word's replaced by
    the model's), suspect ([{word, text, tag, suggested}]). score: cleanlab's label quality, 0 (surely wrong) to 1."""
    fold = fold_of(np.unique(np.array([e.intent for e in examples], dtype=object), return_inverse=True)[1],
                   cfg.folds, cfg.seed, [model_text(e) for e in examples])
    out: list[dict] = []
    found, summary = intent_issues(feats.utterance, [e.intent for e in examples], fold, cfg, store)
    summary = {"intent": summary}
    for r, (i, label, suggested, score) in enumerate(found, 1):
        out.append({"kind": "intent", "rank": r, **_where(examples[i], i), "label": label, "suggested": suggested,
                    "score": float(f"{score:.4g}")})
    if cfg.slots and examples and examples[0].tags is not None:
        tags = [list(e.tags[:feats.n_words(i)]) for i, e in enumerate(examples)]
        found, summary["slots"] = slot_issues(feats, tags, fold, cfg, store)
        for r, (i, words, suggested, score) in enumerate(found, 1):
            ex = examples[i]
            suspect = [{"word": w, "text": ex.words[w], "tag": tags[i][w], "suggested": suggested[w]} for w in words]
            out.append({"kind": "slots", "rank": r, **_where(ex, i), "label": _spans(tags[i], ex.words),
                        "suggested": _spans(suggested, ex.words), "suspect": suspect, "score": float(f"{score:.4g}")})
    return out, summary


def find_label_issues(data, cfg: LabelIssuesConfig, cache_dir: Path | None = None, progress: bool = True) -> dict:
    """Suspected label errors in `data`'s train split (an edgekit.data.dataset.Dataset), out of sample.

    `cache_dir`: the stage cache's root (edgekit.engine.cache.default_dir(--cache) when None); the features are
    kept in its features/ folder. Returns {"rows": [...], "summary": {...}}: rows as issues_from_features gives
    them, intents first, each kind ranked from 1; summary: the config, the figures of each kind, the cost."""
    from edgekit.engine.cache import default_dir  # a leaf: the cache folder the build uses, no torch
    from edgekit.modeling.pretrained import base_folder

    root = Path(cache_dir) if cache_dir is not None else default_dir()
    examples = data.splits["train"]
    folder = base_folder(cfg.base_model, root / "models")
    feats, info = cached_features([e.text for e in examples], folder, cfg, root / "features", progress)
    t0 = time.perf_counter()
    rows, summary = issues_from_features(examples, feats, cfg, ProbCache(root / "features", info["key"]))
    words = sum(len(e.words) for e in examples)
    summary.update(config=cfg.to_dict(), data=getattr(data, "source", None), split="train",
                   words_not_judged=words - int(feats.offsets[-1]) if data.has_slots else 0,
                   features={"cached": info["cached"], "key": info["key"], "seconds": round(info["seconds"], 2)},
                   fit_seconds=round(time.perf_counter() - t0, 2))
    return {"rows": rows, "summary": summary}


def write_label_issues(result: dict, path: str | Path) -> None:
    """label_issues.jsonl: one row a line, as find_label_issues ranks them (intents, then slots); written atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in result["rows"]:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
