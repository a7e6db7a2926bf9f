"""Pass: bake the decoding into the graph, so the package answers final ids instead of logits.

`with_decoding(model, cfg)` wraps a joint model in `DecodedModel`, whose forward is all fixed-shape tensor ops
(exportable to ExecuTorch and ONNX alike):

1. intent whitelist: the build's allowed intents AND the run-time `intent_mask` input, applied before the
   softmax, so the confidence is renormalised over the allowed intents;
2. out-of-scope rejection: below the calibrated confidence threshold the answer is the reserved `oos` id
   (when the run-time `reject` input is true);
3. slots: Viterbi over BIO tags on each word's first piece, with only valid BIO moves (`I-x` after `B-x`/`I-x`)
   and only the slots seen with the predicted intent in training. The output is one tag id per word.

Inputs:  input_ids (1, T) int64, attention_mask (1, T) int64, word_starts (1, T) bool (first piece of a word),
         intent_mask (I,) bool, reject (1,) bool.
Outputs: intent (1,) int64 (I = the reserved oos id unless the data has its own oos class), confidence (1,) float,
         and with slots tags (1, T) int64: word w's tag id at [0, w], "O" past the last word.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from edgekit.record import PassRecord

NEG = -1e4  # a blocked move: larger than any sum of logit differences along a path, finite so no inf - inf


def bio_transitions(tags: list[str]) -> torch.Tensor:
    """(S, S) additive scores from tag j (row) to tag i (column): 0 if BIO allows the move, NEG if not."""
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


def viterbi(emit: torch.Tensor, starts: torch.Tensor, trans: torch.Tensor, o_id: int = 0) -> torch.Tensor:
    """Best tag path over the word-start positions; other positions carry the previous tag unchanged.

    emit (B, T, S) scores, starts (B, T) bool, trans (S, S) from-to scores. Returns (B, T) tag ids per piece.
    Unrolled over the fixed T so it exports as plain tensor ops (no loops, no data-dependent shapes). Each step
    is three ops (select, add, max): the score alternates between a column (B, S, 1) and a row (B, 1, S) so that
    no reshape is needed between steps; on a phone every op call counts, not the S*S arithmetic."""
    B, T, S = emit.shape
    eye = torch.eye(S, dtype=torch.bool, device=emit.device)
    stay = torch.where(eye, torch.zeros_like(trans), torch.full_like(trans, NEG))  # a non-start piece keeps its tag
    step = torch.where(starts[:, :, None, None], trans, stay)  # (B, T, from, to)
    step = step + torch.where(starts[:, :, None], emit, torch.zeros_like(emit))[:, :, None, :]  # + emission of "to"
    step_t = step.transpose(2, 3)  # (B, T, to, from)
    # Paths start from O, so the first word cannot be I-x.
    score = torch.where(torch.arange(S, device=emit.device) == o_id, 0.0, NEG).to(emit.dtype)
    score = score[None, :, None].expand(B, S, 1)  # column: "from" along dim 1
    back = []
    for t in range(1, T):  # position 0 is [CLS]
        if t % 2:  # column in, row out
            score, bp = (score + step[:, t]).max(1, keepdim=True)  # (B, 1, S)
        else:  # row in, column out
            score, bp = (score + step_t[:, t]).max(2, keepdim=True)  # (B, S, 1)
        back.append(bp)
    cur = score.reshape(B, S).argmax(-1).reshape(B, 1, 1)
    path = [cur]
    for bp in reversed(back[1:]):
        cur = bp.gather(2 if bp.shape[1] == 1 else 1, cur)  # (B, 1, 1): the tag one word back
        path.append(cur)
    path.append(torch.full_like(cur, o_id))  # [CLS]
    return torch.cat(path[::-1], 2).reshape(B, T)


def words_of(piece_tags: torch.Tensor, starts: torch.Tensor, o_id: int) -> torch.Tensor:
    """(B, T) piece tags -> (B, T) word tags: word w's tag at column w, O after the last word."""
    B, T = starts.shape
    count = starts.long().cumsum(1)  # (B, T): words started up to each position
    w = torch.arange(T, device=starts.device)
    pos = (count[:, None, :] <= w[None, :, None]).long().sum(-1).clamp(max=T - 1)  # (B, T): position of word w
    tags = piece_tags.gather(1, pos)
    return torch.where(w[None, :] < count[:, -1:], tags, torch.full_like(tags, o_id))


class DecodedModel(nn.Module):
    """A joint model plus in-graph decoding; see the module docstring for inputs and outputs."""

    decoding = True

    def __init__(self, model: nn.Module, base_mask: torch.Tensor, oos_id: int, threshold: float,
                 trans: torch.Tensor | None, slot_bias: torch.Tensor | None, o_id: int = 0):
        super().__init__()
        self.model, self.oos_id, self.threshold, self.o_id = model, oos_id, float(threshold), o_id
        self.register_buffer("base_mask", base_mask)  # (I,) bool: intents the build allows
        self.register_buffer("trans", trans if trans is not None else torch.zeros(0, 0))
        self.register_buffer("slot_bias", slot_bias if slot_bias is not None else torch.zeros(0, 0))
        self.has_slots = trans is not None

    @property
    def cfg(self):
        return self.model.cfg

    def forward(self, input_ids, attention_mask, word_starts, intent_mask, reject):
        out = self.model(input_ids, attention_mask)
        allowed = (intent_mask & self.base_mask)[None, :]  # (1, I)
        probs = torch.softmax(torch.where(allowed, out[0], torch.full_like(out[0], NEG)), -1)  # (B, I)
        conf, intent = probs.max(-1)  # (B,)
        rejected = reject & (conf < self.threshold)
        intent = torch.where(rejected, torch.full_like(intent, self.oos_id), intent)
        if not self.has_slots:
            return intent, conf
        emit = out[1] + self.slot_bias[intent][:, None, :]  # (B, T, S): only the predicted intent's slots
        tags = viterbi(emit, word_starts, self.trans, self.o_id)
        return intent, conf, words_of(tags, word_starts, self.o_id)


@dataclass
class DecodingConfig:
    """What the decoding graph bakes in. `threshold` 0 turns rejection off; `oos_class` True when the data's
    oos label is a trained class (then rejection answers that class and `oos_in_softmax` says whether it takes
    part in the softmax)."""

    intents: list[str]
    slot_tags: list[str]
    intent_slots: dict[str, set[str]] | None = None  # slots seen with each intent; None: no intent-slot whitelist
    allowed_intents: list[str] | None = None  # build-time whitelist (--intents); None: all
    oos_label: str | None = None  # the data's own out-of-scope class, if it has one
    oos_in_softmax: bool = True
    threshold: float = 0.0

    def __post_init__(self):
        unknown = sorted(set(self.allowed_intents or ()) - set(self.intents))
        if unknown:
            raise ValueError(f"--intents names unknown intent {unknown[0]!r}; known: {', '.join(self.intents)}")
        if self.allowed_intents is not None and not self.allowed_intents:
            raise ValueError("--intents is empty")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")

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
    trans = bio_transitions(cfg.slot_tags) if has_slots else None
    bias = intent_slot_table(cfg.intents, cfg.slot_tags, cfg.intent_slots, len(cfg.intents) + 1) if has_slots else None
    dm = DecodedModel(model, cfg.base_mask(), cfg.oos_id, cfg.threshold, trans, bias, o_id=0).eval()
    rec = PassRecord("decoding", seconds=time.perf_counter() - t0, extra={
        "allowed_intents": cfg.allowed_intents, "oos_id": cfg.oos_id, "threshold": cfg.threshold,
        "oos_class": cfg.oos_label in cfg.intents, "oos_in_softmax": cfg.oos_in_softmax,
        "intent_slots": {k: sorted(v) for k, v in cfg.intent_slots.items()} if cfg.intent_slots is not None else None,
        "blocked_transitions": int((trans < 0).sum()) if has_slots else 0,
        "intent_slot_pairs": int((bias[: len(cfg.intents)] == 0).sum()) if has_slots else 0})
    return dm, rec


def config_from_record(labels: dict, extra: dict) -> DecodingConfig:
    """The DecodingConfig a build used, from its record (report.json / state.json), to rebuild the graph eagerly."""
    slots = extra.get("intent_slots")
    return DecodingConfig(labels["intents"], labels["slot_tags"],
                          {k: set(v) for k, v in slots.items()} if slots is not None else None,
                          extra.get("allowed_intents"), labels.get("oos_label"), extra.get("oos_in_softmax", True),
                          extra.get("threshold", 0.0))


def intent_slots_seen(examples) -> dict[str, set[str]]:
    """The slots observed with each intent in `examples` (the intent-to-slot whitelist)."""
    seen: dict[str, set[str]] = {}
    for ex in examples:
        seen.setdefault(ex.intent, set()).update(t[2:] for t in (ex.tags or []) if t != "O")
    return seen


def threshold_for_rate(conf_in_scope: np.ndarray, rate: float) -> float:
    """The confidence below which `rate` of the in-scope utterances fall (they would be rejected)."""
    if not 0 <= rate < 1:
        raise ValueError(f"--oos-far must be in [0, 1), got {rate}")
    return float(np.quantile(conf_in_scope, rate)) if rate > 0 else 0.0


def best_threshold(conf: np.ndarray, pred_ok: np.ndarray, is_oos: np.ndarray, pred_oos: np.ndarray) -> tuple[float, dict]:
    """Threshold that maximises in-scope accuracy + out-of-scope recall on labelled data (dev).

    conf: max probability per utterance; pred_ok: the argmax intent is right (in-scope rows);
    is_oos: gold is out-of-scope; pred_oos: the argmax already answers the oos class."""
    best = (-1.0, 0.0, {})
    for tau in np.unique(np.concatenate([[0.0], conf])):
        reject = pred_oos | (conf < tau)
        ins = float((pred_ok & ~reject)[~is_oos].mean()) if (~is_oos).any() else 0.0
        rec = float(reject[is_oos].mean()) if is_oos.any() else 0.0
        if ins + rec > best[0] + 1e-12:
            best = (ins + rec, float(tau), {"in_scope_acc": ins, "oos_recall": rec})
    return best[1], best[2]


def io_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """(input names, output names) of a raw joint model or a decoded one, as the exported graph calls them."""
    slots = bool(getattr(model.cfg, "n_slots", 0))
    if getattr(model, "decoding", False):
        return (["input_ids", "attention_mask", "word_starts", "intent_mask", "reject"],
                ["intent", "confidence"] + (["tags"] if slots else []))
    return ["input_ids", "attention_mask"], ["intent_logits"] + (["slot_logits"] if slots else [])
