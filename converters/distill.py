"""Pass: knowledge distillation from the fine-tuned teacher into the (pruned, trimmed) student.

Loss = alpha * T^2 * KL(teacher/T || student/T) + (1 - alpha) * cross-entropy with the gold labels, for the
intent (on [CLS]) and for the slots (on each word's first piece). Teacher and student may tokenize a word
differently (vocabulary budget), so slot targets are matched per word, not per piece. Teacher outputs are
computed once up front: the teacher never runs inside the training loop.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from edgekit.data.augment import replace_words, swap_mentions
from edgekit.modeling.model import JointModel, count_params, enable_word_pool, param_bytes
from edgekit.modeling.training import IGNORE, collate, featurize, fit, predict_eager
from edgekit.record import PassRecord, PassResult
from edgekit.runtime.tokenizer import WORD_START
from edgekit.scoring.score import score


@dataclass
class DistillInputs:
    """The live inputs of a distillation: the teacher and its tokenizer, the student's tokenizer, the data."""

    teacher: JointModel
    teacher_tokenizer: object
    student_tokenizer: object
    train: list  # Examples
    dev: list
    labels: dict
    max_len: int = 128  # the package's sequence length
    # Teacher hidden-state index (0 = embeddings, k = after layer k) matched by each student layer's output;
    # None: no hidden-state matching. Set from the layers pruning kept, or `uniform_layers` for another encoder.
    # A teacher of another width (MPNet-base's 768 against a MiniLM student's 384) is met through a learned
    # projection of each student layer (discarded after training).
    layer_map: list[int] | None = None
    # Dev metrics of a model, used to keep the best epoch (the build passes its own evaluation: the decoding
    # graph the package ships). None: plain per-word argmax.
    evaluate: Callable[[JointModel], dict] | None = None
    # Seed of the augmented utterances (None: DistillConfig.seed). The build gives --seed, so that distill.seed
    # (a new student on the same teacher) draws the same utterances, whose teacher outputs `memo` may keep.
    pool_seed: int | None = None
    # memo(compute) -> the teacher's outputs (teacher_targets' tuple): compute() or a stored copy of them.
    memo: Callable[[Callable[[], tuple]], tuple] | None = None
    # Unlabelled utterances (Examples without intent or tags, DistillConfig.unlabelled's lines): the teacher's
    # outputs are their only targets.
    unlabelled: list = field(default_factory=list)


@dataclass
class DistillConfig:
    """Distillation hyperparameters (the `[distill]` table). Defaults: measured on SNIPS (docs/passes.md)."""

    temperature: float = 4.0
    alpha: float = 0.7  # weight of the soft (teacher) targets
    hidden_weight: float = 1.0  # weight of hidden-state matching (0: logits only)
    # Weight of relation matching (MiniLMv2-style, on hidden states at [CLS] and each word's first piece, last matched
    # layer): per relation head, the softmax of the scaled dot products between words, student against teacher (KL).
    # It needs no equal widths and no projection. 0: off.
    relation_weight: float = 0.0
    relation_heads: int = 12  # must divide both widths (MiniLM 384, MPNet-base 768)
    # Extra training utterances, as a share of train, made by swapping slot values (edgekit.data.dataset.swap_mentions),
    # or on intent-only data by replacing a `word_noise` share of words (edgekit.data.dataset.replace_words); the teacher
    # labels them like the rest.
    augment: float = 1.0
    word_noise: float = 0.15
    # Share of the open-class slot values in those utterances made of words the teacher's vocabulary has whole
    # and the student's does not: unseen names, split into small pieces, as the test data will have.
    novel: float = 0.5
    epochs: int = 10
    batch_size: int = 32
    lr: float = 4e-4
    weight_decay: float = 0.01
    warmup: float = 0.06
    seed: int = 0
    steps_limit: int | None = None
    # Autocast the student's forward pass to bfloat16. Off by default: on the pruned MiniLM student the casts
    # cost more than the smaller matmuls save (SNIPS: 7.7 vs 8.4 steps/s on 2 cores, docs/experiments.md).
    bf16: bool = False
    # The student's slot head reads the mean of each word's pieces, not the first piece alone (JointModel.pool_words).
    word_pool: bool = False
    # The teacher: None, the build's own (the teacher stage's, which the student is pruned from); or another base
    # model (a --base-model name or folder), fine-tuned as a server build of it would be, and shared with that build.
    teacher: str | None = None
    # With `teacher`: a teacher assistant. The build's own teacher (the base model it compresses, fine-tuned) first
    # learns from `teacher` by this distillation (logits only, `assistant_epochs` at `assistant_lr`, on the same
    # augmented utterances), and then teaches the student as it would alone.
    assistant: bool = False
    assistant_epochs: int = 3
    assistant_lr: float = 5e-5
    # A text file of unlabelled utterances, one a line (an app's logs, say): the teacher labels them and they join
    # the augmented utterances, so the student meets words and pieces beyond the task's. None: off.
    unlabelled: str | None = None
    unlabelled_max: int = 20000  # at most this many of its lines, the first ones (each one is labelled and trained on)

    def __post_init__(self):
        if not 0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.augment < 0:
            raise ValueError(f"augment must be >= 0, got {self.augment}")
        if not 0 <= self.word_noise <= 1:
            raise ValueError(f"word_noise must be in [0, 1], got {self.word_noise}")
        if not 0 <= self.novel <= 1:
            raise ValueError(f"novel must be in [0, 1], got {self.novel}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.hidden_weight < math.inf:
            raise ValueError(f"hidden_weight must be a finite number >= 0, got {self.hidden_weight}")
        if not 0 <= self.relation_weight < math.inf:
            raise ValueError(f"relation_weight must be a finite number >= 0, got {self.relation_weight}")
        if self.relation_heads < 1:
            raise ValueError(f"relation_heads must be >= 1, got {self.relation_heads}")
        if self.assistant and not self.teacher:
            raise ValueError("assistant needs a teacher to learn from: set distill.teacher (e.g. mpnet)")
        if self.assistant_epochs < 1:
            raise ValueError(f"assistant_epochs must be >= 1, got {self.assistant_epochs}")
        if not 0 < self.assistant_lr < 1:
            raise ValueError(f"assistant_lr must be in (0, 1), got {self.assistant_lr}")
        if self.unlabelled_max < 1:
            raise ValueError(f"unlabelled_max must be >= 1, got {self.unlabelled_max}")
        if self.unlabelled is not None and not Path(self.unlabelled).is_file():
            raise ValueError(f"unlabelled: file not found: {self.unlabelled}")


def novel_words(teacher_tokenizer, student_tokenizer, min_chars: int = 3) -> list[str]:
    """Alphabetic words that are one whole piece for the teacher and more than one for the student."""
    out = []
    sp = teacher_tokenizer.sp
    for piece in (sp.id_to_piece(i) for i in range(sp.get_piece_size())):
        word = piece[1:]
        if piece.startswith("\u2581") and len(word) >= min_chars and word.isalpha() and word.isascii():
            if len(student_tokenizer.word_ids(word)) > 1:
                out.append(word)
    return out


def continues_word(tokenizer) -> list[bool]:
    """Per piece of a SentencePiece tokenizer: True when it continues a word (no `▁`; byte pieces too, since
    they spell out a character inside a word), False for word-start pieces and specials."""
    sp = tokenizer.sp
    return [sp.is_byte(i) or not (sp.is_control(i) or sp.is_unknown(i) or sp.id_to_piece(i).startswith(WORD_START))
            for i in range(sp.get_piece_size())]


def uniform_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """A layer map for a student distilled from a deeper encoder: student layer k matches teacher layer
    (k + 1) * L_t / L_s rounded half up, so the last layers meet (12 -> 4: [3, 6, 9, 12])."""
    return [math.floor((k + 1) * teacher_layers / student_layers + 0.5) for k in range(student_layers)]


def projections(student: JointModel, teacher: JointModel, layers: int) -> torch.nn.ModuleList | None:
    """One (H_s -> H_t) linear map per matched layer where the widths differ, else None."""
    hs, ht = student.cfg.hidden, teacher.cfg.hidden
    return None if hs == ht else torch.nn.ModuleList(torch.nn.Linear(hs, ht, bias=False) for _ in range(layers))


def _word_positions(feats, i: int) -> list[int]:
    """Positions of each kept word's first piece in example i (word order)."""
    return [p for p, w in enumerate(feats.encodings[i].word_index) if w >= 0]


@torch.no_grad()
def teacher_targets(teacher: JointModel, feats, pad_id: int, layer_map: list[int] | None = None,
                    batch: int = 128) -> tuple[torch.Tensor, list, list]:
    """Intent logits (N, I); per example, word-level slot logits (n_words, S) (or None) and, with a layer_map,
    hidden states at [CLS] and each word's first piece (len(layer_map), 1 + n_words, H), stored in fp16."""
    teacher.eval()
    n = len(feats.ids)
    intents, words, hidden = torch.zeros(n, teacher.cfg.n_intents), [None] * n, [None] * n
    order = sorted(range(n), key=lambda i: len(feats.ids[i]))
    for s in range(0, n, batch):
        idx = order[s:s + batch]
        ids, mask, _, _ = collate(feats, idx, pad_id)
        states = teacher.encode(ids, mask)
        out = teacher.heads(states[-1], ids, mask)
        intents[idx] = out[0]
        for b, i in enumerate(idx):
            pos = _word_positions(feats, i)
            if len(out) > 1:
                words[i] = out[1][b, pos].clone()  # (n_words, S)
            if layer_map:
                hidden[i] = torch.stack([states[k][b, [0] + pos] for k in layer_map]).half()
    return intents, words, hidden


def augmented(x: DistillInputs, cfg: DistillConfig) -> tuple[list, list[str] | None]:
    """train, then `augment` x its size more utterances: slot values swapped (a `novel` share of them words the
    teacher has whole and the student splits), or on intent-only data a `word_noise` share of words replaced; then
    the unlabelled utterances. Returns them and the novel words."""
    seed = cfg.seed if x.pool_seed is None else x.pool_seed
    novel, n_extra = None, round(cfg.augment * len(x.train))
    if any(t != "O" for ex in x.train for t in ex.tags or []):
        novel = novel_words(x.teacher_tokenizer, x.student_tokenizer) if cfg.novel > 0 else None
        extra = swap_mentions(x.train, n_extra, seed, novel, cfg.novel)
    else:  # intent-only data has no slot values to swap
        extra = replace_words(x.train, n_extra, seed, cfg.word_noise)
    return x.train + extra + x.unlabelled, novel


def pack_targets(targets: tuple) -> dict[str, torch.Tensor]:
    """teacher_targets' tuple as flat tensors, for safetensors: each example's rows concatenated, with their counts."""
    intents, words, hidden = targets
    out = {"intents": intents}
    if words and words[0] is not None:
        out["words"], out["words_n"] = torch.cat(words), torch.tensor([len(w) for w in words])
    if hidden and hidden[0] is not None:
        out["hidden"], out["hidden_n"] = torch.cat(hidden, 1), torch.tensor([h.shape[1] for h in hidden])
    return out


def unpack_targets(t: dict[str, torch.Tensor]) -> tuple:
    """pack_targets, undone."""
    n = len(t["intents"])
    words = list(torch.split(t["words"], t["words_n"].tolist())) if "words" in t else [None] * n
    hidden = list(torch.split(t["hidden"], t["hidden_n"].tolist(), 1)) if "hidden" in t else [None] * n
    return t["intents"], words, hidden


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, hard: torch.Tensor, T: float, alpha: float):
    """alpha * T^2 * KL(soft) + (1 - alpha) * CE(hard); rows whose hard label is IGNORE count only in the soft part."""
    student = student.float()  # under bf16 autocast the logits come out bf16; the loss stays FP32
    soft = F.kl_div(F.log_softmax(student / T, -1), F.softmax(teacher / T, -1), reduction="batchmean") * T * T
    hard_loss = F.cross_entropy(student, hard, ignore_index=IGNORE) if (hard != IGNORE).any() else student.sum() * 0
    return alpha * soft + (1 - alpha) * hard_loss


def relations(h: torch.Tensor, b_idx: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H) word states of a batch (rows of one utterance together, b_idx (N,) its index) -> (B, heads, M, M)
    log-softmax of scaled dot products within each utterance (M: its most words), and the (B, M) word mask."""
    N, H = h.shape
    if H % heads:
        raise ValueError(f"relation_heads {heads} does not divide the width {H}")
    counts = torch.bincount(b_idx)
    j_idx = torch.arange(N) - (counts.cumsum(0) - counts)[b_idx]  # each row's place in its utterance
    x = h.float().new_zeros(len(counts), int(counts.max()), H)
    x[b_idx, j_idx] = h.float()
    mask = torch.zeros(x.shape[:2], dtype=torch.bool)
    mask[b_idx, j_idx] = True
    x = x.view(*x.shape[:2], heads, H // heads).transpose(1, 2)  # (B, R, M, d)
    scores = x @ x.transpose(-1, -2) / math.sqrt(H // heads)  # (B, R, M, M)
    return scores.masked_fill(~mask[:, None, None, :], -math.inf).log_softmax(-1), mask


def relation_loss(student: torch.Tensor, teacher: torch.Tensor, b_idx: torch.Tensor, heads: int) -> torch.Tensor:
    """KL(teacher || student) of the word-to-word relations, averaged over heads and words."""
    s, mask = relations(student, b_idx, heads)
    t, _ = relations(teacher, b_idx, heads)
    pair = mask[:, None, :, None] & mask[:, None, None, :]  # (B, 1, M, M): both words real
    kl = (t.exp() * (t - s)).masked_fill(~pair, 0.0)  # 0 * (-inf - -inf) would be NaN on padding
    return kl.sum() / (heads * len(b_idx))


def distill(model: JointModel, inputs: DistillInputs, cfg: DistillConfig) -> PassResult:
    """Train `model` (the student) on the teacher's soft targets; keep the best dev checkpoint."""
    t0 = time.perf_counter()
    x = inputs
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    rec = PassRecord("distill", params_before=count_params(model), bytes_before=param_bytes(model))
    if cfg.word_pool and model.cfg.n_slots:
        enable_word_pool(model, continues_word(x.student_tokenizer))
    train, novel = augmented(x, cfg)
    s_feats = featurize(train, x.student_tokenizer, x.labels, x.max_len)
    t_feats = featurize(train, x.teacher_tokenizer, x.labels, x.max_len)
    layer_map = x.layer_map if cfg.hidden_weight > 0 or cfg.relation_weight > 0 else None
    if layer_map is not None and len(layer_map) != model.cfg.layers:
        raise ValueError(f"layer_map has {len(layer_map)} entries for a {model.cfg.layers}-layer student")
    compute = lambda: teacher_targets(x.teacher, t_feats, x.teacher_tokenizer.pad_id, layer_map)  # noqa: E731
    t_intent, t_words, t_hidden = x.memo(compute) if x.memo else compute()
    proj = projections(model, x.teacher, len(layer_map)) if layer_map and cfg.hidden_weight > 0 else None
    s_pos = [_word_positions(s_feats, i) for i in range(len(s_feats.ids))]
    t_pos_n = [_word_positions(t_feats, i) for i in range(len(t_feats.ids))]
    tag_id = {t: k for k, t in enumerate(x.labels["slot_tags"])}
    # no tags (unlabelled utterances, or intent-only data): no hard slot target, the teacher's alone
    word_tags = [[tag_id.get(t, IGNORE) for t in ex.tags] if ex.tags else [IGNORE] * len(ex.words) for ex in train]
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    if proj is not None:
        groups.append({"params": list(proj.parameters()), "weight_decay": 0.0})
    lengths = [len(x) for x in s_feats.ids]  # batches grouped by length: less padding per step

    def step_loss(idx):
        ids, mask, intents, slots = collate(s_feats, idx, x.student_tokenizer.pad_id)
        states = model.encode(ids, mask)
        out = model.heads(states[-1], ids, mask)
        loss = kd_loss(out[0], t_intent[idx], intents, cfg.temperature, cfg.alpha)
        # Truncation may keep fewer words on one side: match the words both kept.
        n = [min(len(s_pos[i]), len(t_pos_n[i])) for i in idx]
        if layer_map:
            # Hidden states at [CLS] and each word's first piece, student layer k against its teacher layer.
            b_idx = torch.tensor([b for b, k in enumerate(n) for _ in range(k + 1)], dtype=torch.long)
            p_idx = torch.tensor([p for i, k in zip(idx, n) for p in [0] + s_pos[i][:k]], dtype=torch.long)
            target = torch.cat([t_hidden[i][:, : k + 1].float() for i, k in zip(idx, n)], 1)  # (L, W, H)
            got = [st[b_idx, p_idx] for st in states[1:]]  # L x (W, H_s)
            if cfg.relation_weight > 0:
                loss = loss + cfg.relation_weight * relation_loss(got[-1], target[-1], b_idx, cfg.relation_heads)
            if cfg.hidden_weight > 0:
                got = torch.stack([f(g) for f, g in zip(proj, got)] if proj is not None else got).float()  # (L, W, H_t)
                loss = loss + cfg.hidden_weight * F.mse_loss(got, target)
        if len(out) > 1:
            b_idx = torch.tensor([b for b, k in enumerate(n) for _ in range(k)], dtype=torch.long)
            p_idx = torch.tensor([p for i, k in zip(idx, n) for p in s_pos[i][:k]], dtype=torch.long)
            teacher_w = torch.cat([t_words[i][:k] for i, k in zip(idx, n)])  # (W, S)
            hard_w = torch.tensor([t for i, k in zip(idx, n) for t in word_tags[i][:k]], dtype=torch.long)
            loss = loss + kd_loss(out[1][b_idx, p_idx], teacher_w, hard_w, cfg.temperature, cfg.alpha)
        return loss

    def evaluate(m):
        return x.evaluate(m) if x.evaluate else score(
            x.dev, predict_eager(m, x.dev, x.student_tokenizer, x.labels, x.max_len), x.labels)

    res = fit(model, groups, len(s_feats.ids), step_loss, evaluate, epochs=cfg.epochs, batch_size=cfg.batch_size,
              lr=cfg.lr, warmup=cfg.warmup, rng=rng, lengths=lengths, steps_limit=cfg.steps_limit, bf16=cfg.bf16,
              desc="distill")
    curve = res.curve
    rec.extra.update(best_epoch=res.best_epoch, best_dev=res.best_dev)  # the kept model's dev metrics
    rec.params_after, rec.bytes_after = count_params(model), param_bytes(model)
    rec.extra.update(curve=curve, temperature=cfg.temperature, alpha=cfg.alpha, epochs=cfg.epochs, lr=cfg.lr,
                     augmented=len(train) - len(x.train) - len(x.unlabelled), unlabelled=len(x.unlabelled),
                     novel_share=cfg.novel,
                     novel_words=len(novel or []), word_pool=model.cfg.word_pool,
                     hidden_weight=cfg.hidden_weight if layer_map else 0.0, layer_map=layer_map,
                     relation_weight=cfg.relation_weight if layer_map else 0.0,
                     hidden_projection=[model.cfg.hidden, x.teacher.cfg.hidden] if proj is not None else None)
    rec.seconds = time.perf_counter() - t0
    return PassResult(model, rec)
