"""Does a learned tag-transition matrix (a CRF layer) under the intent-to-slot whitelist help the distilled student?

The package decodes each utterance by Viterbi over the student's per-word slot scores with structure only: an
I-x tag follows B-x or I-x, and the predicted intent's whitelist blocks the slots never seen with it
(converters/decoding.py). Here a linear-chain CRF (a start, an end and an S x S transition score, the student's
per-word log-probabilities as emissions, frozen) is fitted by maximum likelihood under the same structure, the
gold intent's whitelist applied, on train or on dev; then dev and test are decoded with it, the predicted intent's
whitelist applied, and scored as the build scores them. A CRF trained jointly with the student (JointBERT-CRF)
could gain more; this measures what the transitions alone add to today's student.

    python examples/crf_study.py ../shared/data/snips --set distill.seed=2
"""

from __future__ import annotations

import argparse
import json

import torch


def emissions(ctx, model, tokenizer, examples) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Intent logits (N, I) and, per example, (W, S) slot log-probabilities at each word's first piece (the
    outputs distillation reads from a teacher)."""
    from edgekit.converters.distill import teacher_targets
    from edgekit.modeling.training import featurize

    intents, words, _ = teacher_targets(model, featurize(examples, tokenizer, ctx.labels, ctx.max_len),
                                        tokenizer.pad_id)
    return intents[:, : len(ctx.data.intents)].float(), [w.float().log_softmax(-1) for w in words]


def structure(tags: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, S) transition mask (0 allowed, NEG not: I-x only after B-x or I-x) and (S,) start mask (no I-x first),
    as the package's graph and the transitions pass have them."""
    from edgekit.converters.decoding import bio_transitions
    from edgekit.converters.transitions import structure as bio_start

    return bio_transitions(tags), bio_start(tags)[0]


def padded(words: list[torch.Tensor], allow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, W, S) emissions with the whitelist added (allow: (B, S) additive), and (B, W) bool word mask."""
    B, W, S = len(words), max(len(w) for w in words), words[0].shape[1]
    e, m = torch.zeros(B, W, S), torch.zeros(B, W, dtype=torch.bool)
    for b, w in enumerate(words):
        e[b, : len(w)], m[b, : len(w)] = w + allow[b], True
    return e, m


class CRF(torch.nn.Module):
    """Linear-chain CRF scores over fixed emissions, under a structural mask. "full": an S x S transition score;
    "factored": a score for leaving each tag plus one for entering it, and one per I-x for each of its two allowed
    predecessors (B-x, I-x). The factored form keeps the graph's Viterbi step one whole-tensor max
    (converters/decoding.py): the best predecessor of a tag other than I-x is the same for every such tag."""

    def __init__(self, tags: list[str], form: str = "full"):
        super().__init__()
        S = len(tags)
        self.form = form
        self.start, self.end = torch.nn.Parameter(torch.zeros(S)), torch.nn.Parameter(torch.zeros(S))
        self.pair = torch.nn.Parameter(torch.zeros(S, S))  # full: every move; factored: I-x's two only
        self.leave, self.enter = torch.nn.Parameter(torch.zeros(S)), torch.nn.Parameter(torch.zeros(S))
        mask_t, mask_s = structure(tags)
        self.register_buffer("mask_t", mask_t)
        self.register_buffer("mask_s", mask_s)
        cont = torch.tensor([[t.startswith("I-") and u[2:] == t[2:] and u != "O" for t in tags] for u in tags])
        self.register_buffer("cont", cont.float())  # (S, S) 1 on B-x -> I-x and I-x -> I-x

    @property
    def trans(self) -> torch.Tensor:
        if self.form == "full":
            return self.pair
        # entering I-x: only its own two predecessors, each scored alone (no leave/enter sum)
        shared = (self.leave[:, None] + self.enter[None, :]) * (1 - self.cont.amax(0, keepdim=True))
        return shared + self.pair * self.cont

    def log_partition(self, e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """(B,) log sum over every allowed path."""
        T = self.trans + self.mask_t
        a = e[:, 0] + self.start + self.mask_s  # (B, S)
        for w in range(1, e.shape[1]):
            nxt = torch.logsumexp(a[:, :, None] + T[None], 1) + e[:, w]  # (B, S)
            a = torch.where(m[:, w, None], nxt, a)
        return torch.logsumexp(a + self.end, -1)

    def path_score(self, e: torch.Tensor, m: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(B,) score of the tag paths y (B, W) (padding ignored)."""
        s = e.gather(2, y[..., None])[..., 0] * m  # (B, W)
        tr = self.trans[y[:, :-1], y[:, 1:]] * m[:, 1:]
        last = y.gather(1, (m.sum(1, keepdim=True) - 1))[:, 0]
        return s.sum(1) + tr.sum(1) + self.start[y[:, 0]] + self.end[last]

    @torch.no_grad()
    def decode(self, e: torch.Tensor, m: torch.Tensor) -> list[list[int]]:
        T = self.trans + self.mask_t
        a, back = e[:, 0] + self.start + self.mask_s, []
        for w in range(1, e.shape[1]):
            best, arg = (a[:, :, None] + T[None]).max(1)  # (B, S)
            back.append(arg)
            a = torch.where(m[:, w, None], best + e[:, w], a)
        tag = (a + self.end).argmax(-1)
        n, paths = m.sum(1).tolist(), []
        for b in range(e.shape[0]):
            path = [int(tag[b])]
            for w in range(n[b] - 1, 0, -1):
                path.append(int(back[w - 1][b, path[-1]]))
            paths.append(path[::-1])
        return paths


def fit(crf: CRF, words, allow, gold, epochs: int, l2: float, seed: int = 0) -> None:
    """Maximum likelihood of the gold paths; L2 on the scores (they start at 0, structure only)."""
    opt, rng = torch.optim.Adam(crf.parameters(), lr=0.05), torch.Generator().manual_seed(seed)
    keep = [i for i, w in enumerate(words) if len(w)]
    for _ in range(epochs):
        for chunk in torch.randperm(len(keep), generator=rng).split(256):
            idx = [keep[i] for i in chunk]
            e, m = padded([words[i] for i in idx], allow[idx])
            y = torch.zeros(m.shape, dtype=torch.long)
            for b, i in enumerate(idx):
                y[b, : len(gold[i])] = torch.tensor(gold[i])
            nll = (crf.log_partition(e, m) - crf.path_score(e, m, y)).mean()
            loss = nll + l2 * sum((p ** 2).sum() for p in crf.parameters())
            opt.zero_grad()
            loss.backward()
            opt.step()


def evaluate(ctx, crf: CRF, examples, intents, words, table) -> dict:
    from edgekit.scoring.score import score

    k = intents.argmax(-1)
    tags, answers = ctx.data.slot_tags, []
    keep = [i for i, w in enumerate(words) if len(w)]
    paths = dict(zip(keep, crf.decode(*padded([words[i] for i in keep], table[k[keep]])))) if keep else {}
    for i, ex in enumerate(examples):
        answers.append({"intent": ctx.data.intents[int(k[i])],
                        "tags": [tags[t] for t in paths.get(i, [])] + ["O"] * (len(ex.words) - len(paths.get(i, [])))})
    m = score(examples, answers, ctx.labels)
    return {"intent_acc": m["intent_acc"], "slot_f1": m["slot_f1"]}


def main(data: str, target: str, sets: list[str], epochs: int, l2: float) -> None:
    from cascade_study import student

    from edgekit.converters.decoding import intent_slot_table
    from edgekit.engine.measure import decoding_config, measure

    ctx, model, tokenizer = student(data, target, sets)
    dc = decoding_config(ctx)
    table = intent_slot_table(dc.intents, dc.slot_tags, dc.intent_slots, len(dc.intents) + 1)  # (I+1, S)
    tag_id = {t: j for j, t in enumerate(ctx.data.slot_tags)}
    split = {s: (ctx.data.splits[s], *emissions(ctx, model, tokenizer, ctx.data.splits[s])) for s in
             ("train", "dev", "test")}
    rows = {"structure only": CRF(ctx.data.slot_tags)}
    for fit_on, form in (("train", "full"), ("dev", "full"), ("train", "factored")):
        exs, _, words = split[fit_on]
        gold_k = torch.tensor([ctx.data.intents.index(ex.intent) for ex in exs])
        gold = [[tag_id[t] for t in ex.tags[: len(w)]] for ex, w in zip(exs, words)]
        crf = CRF(ctx.data.slot_tags, form)
        fit(crf, words, table[gold_k], gold, epochs, l2)
        rows[f"{form}, fitted on {fit_on}"] = crf
    out = {name: {s: evaluate(ctx, crf, *split[s], table) for s in ("dev", "test")} for name, crf in rows.items()}
    out["graph (edgekit measure), test"] = {k: v for k, v in measure(ctx, model, tokenizer, "test").items()
                                            if k in ("intent_acc", "slot_f1")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--target", default="android")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--l2", type=float, default=1e-4)
    a = ap.parse_args()
    main(a.data, a.target, a.sets, a.epochs, a.l2)
