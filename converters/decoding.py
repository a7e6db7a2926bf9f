"""Pass: bake the decoding into the graph, so the package answers final ids instead of logits.

`with_decoding(model, cfg)` wraps a joint model in `DecodedModel`, whose forward is all fixed-shape tensor ops
(exportable to ExecuTorch and ONNX alike):

1. intent whitelist: the build's allowed intents AND the run-time `intent_mask` input, applied before the
   softmax, so the confidence is renormalised over the allowed intents;
2. confidence and out-of-scope rejection: the confidence is the top probability of softmax(logits / T), T a
   temperature fitted on dev so that it means what it says; an utterance whose score (that confidence, or the
   energy T * logsumexp(logits / T), which does not saturate) is below the calibrated threshold is answered
   with the reserved `oos` id (when the run-time `reject` input is true);
3. slots: Viterbi over BIO tags on each word's first piece, with only valid BIO moves (`I-x` after `B-x`/`I-x`)
   and only the slots seen with the predicted intent in training, plus learned transition scores
   (converters/transitions.py) when the build fitted them. The output is one tag id per word.

Inputs: input_ids, attention_mask (1, T), word_pos (1, T - 2) (each word's first piece, 0 past the last word),
intent_mask (I,), reject (1,); server graphs a dynamic batch axis B. Outputs: intent, confidence and, with slots,
tags (1, T) (word w's tag id at column w) and path_confidence (the confidence times each word's probability of its
decoded tag: the score the cascade escalates on). Types and shapes: docs/package-format.md (inputs, outputs).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from edgekit.record import PassRecord

NEG = -1e4  # a blocked move: larger than any sum of logit differences along a path, finite so no inf - inf


def bio_tables(tags: list[str], allowed: list[set[str] | None] | None = None, o: str = "O",
               transitions: dict[str, list[float]] | None = None) -> dict[str, torch.Tensor]:
    """Tables for the Viterbi, one row per allowed slot set (`allowed`; default one row, every slot).

    The Viterbi keeps the tags as P pairs (B-x, I-x), held as two (B, 1, P) halves, so that a step is four cheap
    elementwise/reduce ops whatever the tag count: any tag may follow any tag except that I-x may only follow B-x
    or I-x, i.e. the best predecessor of I-x is the better of its own pair and that of every other tag is the
    best of all. A row keeps only its allowed slots' pairs (the intent-to-slot whitelist), so the steps run over
    the predicted intent's few slots rather than the whole tag set. Pair 0 is (O, dummy) in every row; tags
    without a partner (B-x without I-x, I-x without B-x) share their pair with a dummy, and rows with fewer pairs
    than the widest are padded with dummies. No path may enter a dummy.

    A row's layout: the P first halves, then the P second halves (L = 2P). cols (R, L): the tag id at each
    position (dummies: O). fill (R, 1, L): 0, or NEG on dummies. pad (1, 1, L): a word past the end (0 on O, NEG
    elsewhere). neg (1, 1, P): NEG. o (1, 2): O twice (the columns past the last possible word). prev (L, 1, L): 0
    where position i may precede position j, else NEG. zero (1, 1): back-tracking starts at a virtual O after the
    last word. down, up (1, 1, P): 0..P-1 and P..2P-1, and zero3 (1, 1, 1), for the pointer-table back-tracking.
    With `transitions` (converters/transitions.py, score vectors over tag ids), per row: unary (R, 1, L), start
    (R, 1, P) (first halves), cont (R, 1, L): the moves into I-x from B-x (first P) and from I-x (last P), with
    from_b folded into the unary (so cont's first P are 0); and second (L, 1, 1), 1.0 on the second halves.
    """
    index = {t: k for k, t in enumerate(tags)}
    o_id = index.get(o, 0)
    rows = []
    for ok in allowed or [None]:
        pairs: list[tuple[int | None, int | None]] = [(o_id, None)]
        for k, t in enumerate(tags):
            if t == o or (ok is not None and t[2:] not in ok):
                continue
            if t.startswith("B-"):
                pairs.append((k, index.get(f"I-{t[2:]}")))
            elif t.startswith("I-"):
                if f"B-{t[2:]}" not in index:
                    pairs.append((None, k))
            else:
                pairs.append((k, None))
        rows.append(pairs)
    P = max(len(r) for r in rows)
    cols, fill, scored = [], [], {"unary": [], "start": [], "cont": []}
    for pairs in rows:
        pairs = pairs + [(None, None)] * (P - len(pairs))
        layout = [p[0] for p in pairs] + [p[1] for p in pairs]
        cols.append([o_id if k is None else k for k in layout])
        fill.append([NEG if k is None else 0.0 for k in layout])
        if transitions:
            at = lambda vec, ks: [0.0 if k is None else vec[k] for k in ks]  # noqa: E731 (dummies: 0)
            # B-x -> I-x's score is folded into I-x's unary, and I-x -> I-x's becomes the difference: every I-x
            # follows its B-x or itself, so each path scores the same, and the step saves an add
            firsts, seconds = [p[0] for p in pairs], [p[1] for p in pairs]
            from_b, from_i = at(transitions["from_b"], seconds), at(transitions["from_i"], seconds)
            scored["unary"].append(at(transitions["unary"], firsts)
                                   + [u + b for u, b in zip(at(transitions["unary"], seconds), from_b)])
            scored["start"].append(at(transitions["start"], firsts))
            scored["cont"].append([0.0] * P + [i - b for i, b in zip(from_i, from_b)])
    # prev[j, i]: 0 if the tag at position i may precede the one at j, else NEG (only I-x has a constraint).
    prev = torch.zeros(2 * P, 2 * P)
    for x in range(P):
        prev[P + x] = NEG
        prev[P + x, [x, P + x]] = 0.0
    extra = {k: torch.tensor(v)[:, None, :] for k, v in scored.items() if transitions}
    if transitions:
        extra["second"] = (torch.arange(2 * P) >= P).float()[:, None, None]
    return extra | {"cols": torch.tensor(cols), "fill": torch.tensor(fill)[:, None, :],
            "pad": torch.tensor([[[0.0] + [NEG] * (2 * P - 1)]]), "neg": torch.full((1, 1, P), NEG),
            "o": torch.tensor([[o_id, o_id]]),
            "prev": prev[:, None, :], "zero": torch.zeros(1, 1, dtype=torch.long),
            "zero3": torch.zeros(1, 1, 1, dtype=torch.long),
            "down": torch.arange(P)[None, None, :], "up": torch.arange(P, 2 * P)[None, None, :]}


def bio_transitions(tags: list[str]) -> torch.Tensor:
    """(S, S) additive scores from tag j (row) to tag i (column): 0 if BIO allows the move, NEG if not. The
    reference the pair tables implement (tests check one against the other)."""
    S = len(tags)
    trans = torch.zeros(S, S)
    for i, t in enumerate(tags):
        if t.startswith("I-"):
            ok = {f"B-{t[2:]}", t}
            for j, prev in enumerate(tags):
                if prev not in ok:
                    trans[j, i] = NEG
    return trans


def intent_slot_table(intents: list[str], tags: list[str], seen: dict[str, set[str]] | None,
                      rows: int) -> torch.Tensor:
    """(rows, S) additive emission bias per intent id: 0 for "O" and the slots seen with the intent, else NEG.
    Rows past the intents (the reserved oos id) allow only "O". seen=None allows every slot for every intent."""
    table = torch.full((rows, len(tags)), NEG)
    for k in range(rows):
        for s, t in enumerate(tags):
            name = intents[k] if k < len(intents) else None
            if t == "O" or (name is not None and (seen is None or t[2:] in seen.get(name, ()))):
                table[k, s] = 0.0
    return table


def word_positions(starts: torch.Tensor) -> torch.Tensor:
    """starts (B, T) bool first pieces -> (B, T - 2) int64: the position of word w's first piece, 0 past the last
    word (the graph's word_pos input; the runtime computes it with numpy, this is the torch reference)."""
    B, T = starts.shape
    pos = torch.zeros(B, T - 2, dtype=torch.long)
    for b in range(B):
        idx = starts[b].nonzero().flatten()[: T - 2]
        pos[b, : len(idx)] = idx
    return pos


# How each runtime's graph back-tracks (same answers): ExecuTorch's portable kernels pay per element on broadcasting
# ops over the (W, L) table and little per call, so "argmax" (3 small ops per word); ONNX Runtime pays about 1 us
# per node, so "table" (vectorised pointers, then one gather per word). Decoding graph alone, ATIS (159 tags,
# T = 32): ExecuTorch 61 us "argmax" vs 103 us "table"; ONNX Runtime 157 us "table" vs 181 us "argmax".
BACKTRACK = {"executorch": "argmax", "onnx": "table"}


def viterbi(emit: torch.Tensor, word_pos: torch.Tensor, tables: dict[str, torch.Tensor],
            row: torch.Tensor | None = None, backtrack: str = "argmax", batched: bool = False,
            path_score: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Best BIO tag sequence over the words. emit (B, T, S) piece scores, word_pos (B, T - 2) the position of
    each word's first piece (0 past the last word), tables from `bio_tables`, row (B,) each example's table row
    (default 0), backtrack "argmax" or "table" (see BACKTRACK). Returns (B, T): word w's tag id at column w, O
    past the last word. Batched, T may be shorter than W + 2 (a dynamic sequence axis: the batch is cut to its
    longest utterance, the word axis stays the package's); the output is then (B, W + 2). path_score: also return
    (B,) the log-probability of the decoded path if words were independent: the sum over words of log softmax of
    the word's emission over the row's tags (the intent's slots), at the tag chosen.

    Unrolled over the fixed length as plain tensor ops, so it exports to any runtime. The cost is ExecuTorch
    portable-kernel calls (about 0.2 us each), so: the predicted intent's slot pairs only, a forward step of one
    whole-tensor max, two adds and one maximum (an add and a maximum more with learned transitions)."""
    B, T, _ = emit.shape
    one = not batched and B == 1  # a dynamic batch axis must not be specialised to 1 by a Python branch
    W = word_pos.shape[1]  # T - 2: [CLS] and [SEP] leave at most T - 2 words
    cols, fill = tables["cols"], tables["fill"]  # (R, L), (R, 1, L)
    if row is not None:
        cols, fill = cols.index_select(0, row), fill.index_select(0, row)  # (B, L), (B, 1, L)
    elif not one:
        cols, fill = cols.expand(B, -1), fill.expand(B, -1, -1)
    L = cols.shape[-1]
    P = L // 2
    pad, neg, zero, o = tables["pad"], tables["neg"], tables["zero"], tables["o"]
    if one:  # the exported phone case: index_select costs a few portable-kernel microseconds, gather tens
        e = emit.index_select(2, cols.reshape(L)) + fill  # (1, T, L) in the pair layout
        # [CLS]'s row becomes the emission of a word past the end (O only), which word_pos 0 selects.
        e = torch.cat([pad, e[:, 1:]], 1)
        e = e.reshape(T, L).index_select(0, word_pos.reshape(W))  # (W, L): each word's first piece
    else:
        pad, neg, zero, o = pad.expand(B, 1, L), neg.expand(B, 1, P), zero.expand(B, 1), o.expand(B, -1)
        e = emit.gather(2, cols[:, None, :].expand(B, T, L)) + fill
        e = torch.cat([pad, e[:, 1:]], 1).gather(1, word_pos[:, :, None].expand(B, W, L))
    learned = _learned(tables, row, B, one) if "cont" in tables else None  # transitions: unary, start, cont
    halves = (e if learned is None else e.reshape(B, W, L) + learned[0]).reshape(B, 2 * W, P).split(1, dim=1)
    first = halves[0] if learned is None else halves[0] + learned[1]
    p, alpha = first, [first, neg]  # word w: first half at 2w, I-x at 2w + 1; no sentence starts inside a slot
    if learned is not None:
        from_i = learned[2].split(P, -1)[1]  # (B, 1, P): I-x -> I-x less B-x -> I-x (that one is in the unary)
    for w in range(1, W):
        # the best path so far, which any non-I tag follows
        m = p.max() if one else _max(p) if batched else p.amax(-1, keepdim=True)
        if learned is None:  # I-x continues the best of its own pair
            a1, a2 = m + halves[2 * w], p + halves[2 * w + 1]
        else:
            a1, a2 = m + halves[2 * w], torch.maximum(alpha[-2], alpha[-1] + from_i) + halves[2 * w + 1]
        p = torch.maximum(a1, a2)  # (B, 1, P)
        alpha += [a1, a2]
    scores = torch.cat(alpha, 1).reshape(B, W, L)  # best score of a path ending in each tag at each word
    path = _backtrack(scores, tables, learned, backtrack, zero, one)  # (B, W) layout positions
    tags = torch.cat([cols.gather(1, path), o], 1)  # (B, T) tag ids
    if not path_score:
        return tags
    # Dummies sit at NEG, so the softmax is over the row's tags only; a word past the end has only O (pad), whose
    # log-probability is exactly 0, so no mask is needed.
    logp = torch.log_softmax(e.reshape(B, W, L), -1).gather(2, path[:, :, None])  # (B, W, 1)
    return tags, logp.reshape(B, W).sum(-1)


def _backtrack(scores: torch.Tensor, tables: dict, learned: tuple | None, backtrack: str, zero: torch.Tensor,
               one: bool) -> torch.Tensor:
    """(B, W) layout positions of the best path, from scores (B, W, L), starting at a virtual O after the last
    word: word w's tag is the best of the allowed predecessors of word w + 1's (anything before O/B-x, only B-x or
    I-x before I-x, with their move's learned score). Same answers either way; the cost differs by runtime
    (BACKTRACK)."""
    B, W, L = scores.shape
    P, path = L // 2, []
    if backtrack == "argmax":  # per word: a predecessor-row lookup, an add and an argmax on (B, 1, L)
        prev, cur = tables["prev"], zero  # (L, 1, L)
        if learned is not None:  # I-x's two predecessors carry their move's score: this row's table
            prev = prev + tables["second"] * learned[2] if one else \
                (prev[None, :, 0] + tables["second"][None, :, 0] * learned[2])  # (L, 1, L) or (B, L, L)
        steps = scores.split(1, dim=1)
        for w in range(W - 1, -1, -1):
            row_of = prev.index_select(0, cur.reshape(B)) if learned is None or one else \
                prev.gather(1, cur[:, :, None].expand(B, 1, L))  # (B, 1, L)
            cur = (steps[w] + row_of).argmax(-1)  # (B, 1)
            path.append(cur)
        return torch.cat(path[::-1], 1)
    # "table": back-pointers for all words in a few vectorised ops, then one tiny gather per word
    best = scores.argmax(-1, keepdim=True)  # (B, W, 1)
    first, second = (scores if learned is None else scores + learned[2]).split(P, 2)
    pair = torch.where(second > first, tables["up"], tables["down"])  # (B, W, P): I-x came from B-x or I-x
    back = torch.cat([best.expand(B, W, P), pair], 2).split(1, dim=1)  # W x (B, 1, L): position at w given w+1
    cur = tables["zero3"] if one else tables["zero3"].expand(B, 1, 1)
    for w in range(W - 1, -1, -1):
        cur = back[w].gather(2, cur)  # (B, 1, 1)
        path.append(cur)
    return torch.cat(path[::-1], 2).reshape(B, W)


def _learned(tables: dict, row: torch.Tensor | None, B: int, one: bool) -> tuple[torch.Tensor, ...]:
    """The row's unary (B, 1, L), start (B, 1, P) and cont (B, 1, L) transition scores (bio_tables)."""
    out = []
    for k in ("unary", "start", "cont"):
        t = tables[k]
        out.append(t.index_select(0, row) if row is not None else t if one else t.expand(B, -1, -1))
    return tuple(out)


def _max(x: torch.Tensor) -> torch.Tensor:
    """x.amax(-1, keepdim=True) as ArgMax + GatherElements (same values): opset 18 gives ReduceMax its axes as an
    input, which ONNX Runtime's symbolic shape inference cannot read, and the transformer optimizer's
    SkipLayerNormalization fusion needs that inference over the whole (batched) graph."""
    return x.gather(-1, x.argmax(-1, keepdim=True))


class DecodedModel(nn.Module):
    """A joint model plus in-graph decoding; see the module docstring for inputs and outputs."""

    decoding = True
    backtrack = "argmax"
    batched = False  # exported with a dynamic batch axis: intent_mask (B, I), the Viterbi's general path

    def __init__(self, model: nn.Module, base_mask: torch.Tensor, oos_id: int, threshold: float,
                 tables: dict[str, torch.Tensor] | None, score: str = "confidence", temperature: float = 1.0):
        super().__init__()
        self.model, self.threshold, self.score = model, float(threshold), score
        self.temperature = float(temperature)
        self.all_allowed = bool(base_mask.all())  # then the build's whitelist costs no op
        # Constants as buffers, so they travel with .to() and export as constants rather than ops.
        self.register_buffer("base_mask", base_mask)  # (I,) bool: intents the build allows
        self.register_buffer("intent_bias", torch.where(base_mask, 0.0, NEG))  # (I,): the build's whitelist
        self.register_buffer("neg", torch.tensor([NEG]))
        self.register_buffer("oos", torch.tensor([oos_id]))
        self.bio = nn.Module()
        for k, v in (tables or {}).items():
            self.bio.register_buffer(k, v)
        self.has_slots = tables is not None

    @property
    def cfg(self):
        return self.model.cfg

    def for_runtime(self, runtime: str, batched: bool = False) -> "DecodedModel":
        """The same model (shared weights), with the back-tracking that runtime runs fastest (BACKTRACK); batched:
        for a dynamic batch axis."""
        out = copy.copy(self)
        out.backtrack, out.batched = BACKTRACK.get(runtime, "argmax"), batched
        return out

    def forward(self, input_ids, attention_mask, word_pos, intent_mask, reject):
        out = self.model(input_ids, attention_mask)
        logits = out[0] if self.all_allowed else out[0] + self.intent_bias  # (B, I)
        # int32 masks (schema 3: every phone binding creates int32, not every one creates bool): 0 = off
        logits = torch.where(intent_mask != 0, logits, self.neg)  # renormalised over the allowed intents
        if self.temperature != 1.0:
            logits = logits / self.temperature
        probs = torch.softmax(logits, -1)  # (B, I)
        if self.batched:  # (B,) each; no ReduceMax, see _max
            intent = probs.argmax(-1)
            conf = probs.gather(-1, intent[:, None])[:, 0]
        else:
            conf, intent = probs.max(-1)  # (B,)
        score = conf
        if self.score == "energy":  # T * logsumexp(logits / T) = T * (top scaled logit - log confidence): no new op
            score = (logits.gather(-1, intent[:, None])[:, 0] - torch.log(conf)) * self.temperature
        intent = torch.where((reject != 0) & (score < self.threshold), self.oos, intent)
        if not self.has_slots:
            return intent, conf
        # Table row = intent: the Viterbi runs over the predicted intent's slots only (rows past the intents: O).
        tags, logp = viterbi(out[1], word_pos, dict(self.bio.named_buffers()), intent, self.backtrack, self.batched,
                             path_score=True)
        return intent, conf, tags, conf * torch.exp(logp)  # path_confidence (B,): the whole answer's probability


@dataclass
class DecodingConfig:
    """What the decoding graph bakes in. `score` ("confidence" or "energy") below `threshold` is refused;
    the confidence threshold 0 turns rejection off. `temperature` divides the logits before the softmax.
    `oos_class` True when the data's oos label is a trained class (then rejection answers that class and
    `oos_in_softmax` says whether it takes part in the softmax)."""

    intents: list[str]
    slot_tags: list[str]
    intent_slots: dict[str, set[str]] | None = None  # slots seen with each intent; None: no intent-slot whitelist
    allowed_intents: list[str] | None = None  # build-time whitelist (--intents); None: all
    oos_label: str | None = None  # the data's own out-of-scope class, if it has one
    oos_in_softmax: bool = True
    threshold: float = 0.0
    score: str = "confidence"
    temperature: float = 1.0
    # learned transition scores (converters/transitions.py: start, unary, from_b, from_i, each (S,)); None: BIO only
    transitions: dict[str, list[float]] | None = None

    def __post_init__(self):
        unknown = sorted(set(self.allowed_intents or ()) - set(self.intents))
        if unknown:
            raise ValueError(f"--intents names unknown intent {unknown[0]!r}; known: {', '.join(self.intents)}")
        if self.allowed_intents is not None and not self.allowed_intents:
            raise ValueError("--intents is empty")
        if self.score not in ("confidence", "energy"):
            raise ValueError(f"score must be 'confidence' or 'energy', got {self.score!r}")
        if not np.isfinite(self.threshold) or (self.score == "confidence" and not 0 <= self.threshold <= 1):
            raise ValueError(f"a {self.score} threshold must be {'in [0, 1]' if self.score == 'confidence' else 'finite'}"
                             f", got {self.threshold}")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @property
    def oos_id(self) -> int:
        return self.intents.index(self.oos_label) if self.oos_label in self.intents else len(self.intents)

    def base_mask(self) -> torch.Tensor:
        mask = torch.tensor([self.allowed_intents is None or i in self.allowed_intents for i in self.intents])
        if self.oos_label in self.intents and not self.oos_in_softmax:
            mask[self.oos_id] = False
        return mask


def with_decoding(model: nn.Module, cfg: DecodingConfig) -> tuple[DecodedModel, PassRecord]:
    """Wrap `model` in the decoding graph described by `cfg`."""
    t0 = time.perf_counter()
    has_slots = bool(getattr(model.cfg, "n_slots", 0))
    bias = intent_slot_table(cfg.intents, cfg.slot_tags, cfg.intent_slots, len(cfg.intents) + 1) if has_slots else None
    # One table row per intent id (the reserved oos id last): the slots seen with that intent.
    tables = None
    if has_slots:
        allowed = [{t[2:] for t, b in zip(cfg.slot_tags, r) if b == 0 and t != "O"} for r in bias.tolist()]
        tables = bio_tables(cfg.slot_tags, allowed, transitions=cfg.transitions)
    dm = DecodedModel(model, cfg.base_mask(), cfg.oos_id, cfg.threshold, tables, cfg.score, cfg.temperature).eval()
    rec = PassRecord("decoding", seconds=time.perf_counter() - t0, extra={
        "allowed_intents": cfg.allowed_intents, "oos_id": cfg.oos_id, "threshold": cfg.threshold,
        "score": cfg.score, "temperature": cfg.temperature, "transitions": cfg.transitions if has_slots else None,
        "oos_class": cfg.oos_label in cfg.intents, "oos_in_softmax": cfg.oos_in_softmax,
        "intent_slots": {k: sorted(v) for k, v in cfg.intent_slots.items()} if cfg.intent_slots is not None else None,
        "blocked_transitions": int((bio_transitions(cfg.slot_tags) < 0).sum()) if has_slots else 0,
        "intent_slot_pairs": int((bias[: len(cfg.intents)] == 0).sum()) if has_slots else 0})
    return dm, rec


def config_from_record(labels: dict, extra: dict) -> DecodingConfig:
    """The DecodingConfig a build used, from its record (report.json / state.json), to rebuild the graph eagerly."""
    slots = extra.get("intent_slots")
    return DecodingConfig(labels["intents"], labels["slot_tags"],
                          {k: set(v) for k, v in slots.items()} if slots is not None else None,
                          extra.get("allowed_intents"), labels.get("oos_label"), extra.get("oos_in_softmax", True),
                          extra.get("threshold", 0.0), extra.get("score", "confidence"),
                          extra.get("temperature", 1.0), extra.get("transitions"))


def io_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """(input names, output names) of a raw joint model or a decoded one, as the exported graph calls them."""
    slots = bool(getattr(model.cfg, "n_slots", 0))
    if getattr(model, "decoding", False):
        return (["input_ids", "attention_mask", "word_pos", "intent_mask", "reject"],
                ["intent", "confidence"] + (["tags", "path_confidence"] if slots else []))
    return ["input_ids", "attention_mask"], ["intent_logits"] + (["slot_logits"] if slots else [])
