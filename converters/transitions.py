"""Pass: learned tag-transition scores for the decoding graph's Viterbi (a linear-chain CRF over fixed emissions).

The graph's Viterbi knows structure only: I-x follows B-x or I-x, and the predicted intent's slots. This pass
fits, by maximum likelihood of the gold tag paths of train (the gold intent's slots allowed), four per-tag score
vectors over the model's per-word log-probabilities, which stay fixed:

- `start` (S,): the first word's tag;
- `unary` (S,): every word's tag (what a transition score leaving one tag and entering the next adds up to,
  once the I-x moves below are taken out);
- `from_b`, `from_i` (S,), at I-x: the move into I-x from B-x, and from I-x.

Path score = start[y0] + sum_w (emission_w[y_w] + unary[y_w]) + sum over I-x moves of from_b or from_i. These are
the transitions a full S x S table would have, less the pairs of two tags that both start something (O, B-x,
B-y): with them the best predecessor of such a tag is the same for all, so the graph's step stays one
whole-tensor max plus two adds and a maximum (converters/decoding.py). On SNIPS a full table gained no more in a
study (examples/crf_study.py); the packages gained +0.34 slot F1 (ExecuTorch) and +0.48 (ONNX Runtime) over three
seeds (docs/experiments.md, 2026-12-06).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch

from edgekit.converters.decoding import NEG  # a blocked move
from edgekit.record import PassRecord, PassResult


@dataclass
class TransitionConfig:
    """Fitting hyperparameters; epochs and l2 are the `[decoding]` table's `transition_*` keys, the rest fixed."""

    epochs: int = 5
    l2: float = 1e-4  # on the scores, which start at 0 (structure only)
    lr: float = 0.05
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.epochs < 0:
            raise ValueError(f"transition epochs must be >= 0, got {self.epochs}")
        if not 0 <= self.l2 < math.inf:
            raise ValueError(f"transition l2 must be a finite number >= 0, got {self.l2}")
        if not 0 < self.lr < 10:
            raise ValueError(f"transition lr must be in (0, 10), got {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"transition batch_size must be >= 1, got {self.batch_size}")


@dataclass
class TransitionInputs:
    """What the fit reads: the model's tokenizer, the labelled utterances, labels and the intent-to-slot table."""

    tokenizer: object
    train: list  # Examples with tags
    labels: dict
    max_len: int
    allow: torch.Tensor  # (I + 1, S) additive: 0 where the intent allows the tag, NEG where not (intent_slot_table)


def structure(tags: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(S,) start mask (NEG on I-x), (S, S) from-B and from-I indicators: [i, j] = 1 when j is I-x and i is its B-x
    (from_b) or j itself (from_i)."""
    S = len(tags)
    start, fb, fi = torch.zeros(S), torch.zeros(S, S), torch.zeros(S, S)
    for j, t in enumerate(tags):
        if t.startswith("I-"):
            start[j] = NEG
            fi[j, j] = 1.0
            for i, u in enumerate(tags):
                fb[i, j] = float(u == f"B-{t[2:]}")
    return start, fb, fi


class FactoredCRF(torch.nn.Module):
    """The four score vectors, and the CRF's log-likelihood under BIO structure."""

    def __init__(self, tags: list[str]):
        super().__init__()
        S = len(tags)
        self.start, self.unary = torch.nn.Parameter(torch.zeros(S)), torch.nn.Parameter(torch.zeros(S))
        self.from_b, self.from_i = torch.nn.Parameter(torch.zeros(S)), torch.nn.Parameter(torch.zeros(S))
        start, fb, fi = structure(tags)
        self.register_buffer("start_mask", start)
        self.register_buffer("fb", fb)
        self.register_buffer("fi", fi)
        self.register_buffer("is_i", fi.diagonal() > 0)  # (S,) I-x tags
        self.register_buffer("has_b", fb.amax(0) > 0)  # (S,) I-x tags whose B-x exists
        self.register_buffer("b_of", fb.argmax(0))  # (S,) that B-x (0 where none)

    def trans(self) -> torch.Tensor:
        """(S, S) score of the move i -> j: 0 into O/B-x, from_b or from_i into I-x, NEG where BIO forbids."""
        into_i = (self.fb + self.fi).amax(0) > 0  # (S,) I-x columns
        allowed = torch.where(into_i[None, :], (self.fb + self.fi) > 0, torch.ones_like(self.fb, dtype=torch.bool))
        scores = self.fb * self.from_b[None, :] + self.fi * self.from_i[None, :]
        return torch.where(allowed, scores, torch.full_like(scores, NEG))

    def nll(self, e: torch.Tensor, m: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood of the paths y (B, W) under emissions e (B, W, S), word mask m (B, W)."""
        e = e + self.unary
        T = self.trans()
        a = e[:, 0] + self.start + self.start_mask  # (B, S)
        for w in range(1, e.shape[1]):
            # O(S) a step, not O(S^2): a tag other than I-x follows any tag at score 0 (logsumexp of all), I-x
            # follows its B-x or itself
            from_b = torch.where(self.has_b, a[:, self.b_of] + self.from_b, torch.full_like(a, NEG))
            into_i = torch.logaddexp(from_b, a + self.from_i)
            nxt = torch.where(self.is_i, into_i, torch.logsumexp(a, -1, keepdim=True)) + e[:, w]
            a = torch.where(m[:, w, None], nxt, a)
        gold = (e.gather(2, y[..., None])[..., 0] * m).sum(1) + self.start[y[:, 0]]
        gold = gold + (T[y[:, :-1], y[:, 1:]] * m[:, 1:]).sum(1)
        return (torch.logsumexp(a, -1) - gold).mean()

    def scores(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).detach().tolist() for k in ("start", "unary", "from_b", "from_i")}


def word_logprobs(model, tokenizer, examples, labels: dict, max_len: int) -> list[torch.Tensor]:
    """Per example, (W, S) the model's slot log-probabilities at each kept word's first piece (the per-word slot
    scores distillation reads from a teacher)."""
    from edgekit.converters.distill import teacher_targets
    from edgekit.modeling.training import featurize

    _, words, _ = teacher_targets(model, featurize(examples, tokenizer, labels, max_len), tokenizer.pad_id)
    return [w.float().log_softmax(-1) for w in words]


def _valid(tags: list[str]) -> bool:
    """BIO as the graph decodes it: I-x only after B-x or I-x (some gold data breaks it, e.g. ATIS)."""
    return all(not t.startswith("I-") or (k and tags[k - 1][2:] == t[2:] and tags[k - 1] != "O")
               for k, t in enumerate(tags))


def _batch(words, allow, gold, idx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded (B, W, S) emissions with each example's allowed tags, (B, W) mask, (B, W) gold ids."""
    W, S = max(len(words[i]) for i in idx), words[idx[0]].shape[1]
    e, m, y = torch.zeros(len(idx), W, S), torch.zeros(len(idx), W, dtype=torch.bool), torch.zeros(len(idx), W,
                                                                                                   dtype=torch.long)
    for b, i in enumerate(idx):
        n = len(words[i])
        e[b, :n], m[b, :n], y[b, :n] = words[i] + allow[i], True, torch.tensor(gold[i][:n])
    return e, m, y


def fit_transitions(model, inputs: TransitionInputs, cfg: TransitionConfig) -> PassResult:
    """Fit the score vectors on train; the record's extra holds them ("transitions") and the train NLL before and
    after. `model` is unchanged."""
    t0 = time.perf_counter()
    x, tags = inputs, inputs.labels["slot_tags"]
    tag_id, intent_id = {t: k for k, t in enumerate(tags)}, {k: i for i, k in enumerate(x.labels["intents"])}
    exs = [ex for ex in x.train if ex.tags is not None and ex.intent in intent_id and _valid(ex.tags)
           and all(x.allow[intent_id[ex.intent], tag_id[t]] == 0 for t in ex.tags)]  # a path the graph can take
    words = word_logprobs(model, x.tokenizer, exs, x.labels, x.max_len)
    keep = [i for i, w in enumerate(words) if len(w)]
    allow = [x.allow[intent_id[ex.intent]] for ex in exs]
    gold = [[tag_id[t] for t in ex.tags] for ex in exs]
    crf = FactoredCRF(tags)
    opt, rng = torch.optim.Adam(crf.parameters(), lr=cfg.lr), random.Random(cfg.seed)

    def mean_nll() -> float:
        with torch.no_grad():
            chunks = [keep[s:s + 1024] for s in range(0, len(keep), 1024)]
            return sum(float(crf.nll(*_batch(words, allow, gold, c))) * len(c) for c in chunks) / max(1, len(keep))

    before = mean_nll()
    for _ in range(cfg.epochs):
        order = keep[:]
        rng.shuffle(order)
        for s in range(0, len(order), cfg.batch_size):
            loss = crf.nll(*_batch(words, allow, gold, order[s:s + cfg.batch_size]))
            loss = loss + cfg.l2 * sum((p ** 2).sum() for p in crf.parameters())
            opt.zero_grad()
            loss.backward()
            opt.step()
    rec = PassRecord("transitions", seconds=time.perf_counter() - t0,
                     extra={"transitions": crf.scores(), "train_nll_before": before, "train_nll_after": mean_nll(),
                            "utterances": len(keep), "left_out": len(x.train) - len(exs), "epochs": cfg.epochs,
                            "l2": cfg.l2})
    return PassResult(model, rec)
