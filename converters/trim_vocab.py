"""Pass: trim the vocabulary to the task's own pieces and write it as a SentencePiece model.

Kept: every piece the teacher's tokenizer produces on the task corpus, the specials, the 256 byte-fallback
pieces (so no input becomes a bare unknown), and the single-character pieces of every corpus character (so
words whose pieces fall outside a budget still split into known pieces). Under a budget the most frequent
pieces stay. With `base_words` N, the N most frequent words of the base vocabulary are kept too (a WordPiece
vocabulary lists its pieces most frequent first: BERT's begins "the", "of", "and"), so that words the task corpus
never had stay whole instead of splitting into pieces the model never learned; under a budget they come after every
task piece. The embedding rows are gathered to the kept pieces' new ids. The new model's normalizer keeps the CJK and
Hangul rules for the characters of its pieces and of the corpus (edgekit.text.normalizer).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass

from edgekit.modeling.model import JointModel, count_params, factorize_embeddings, gather_embeddings, param_bytes
from edgekit.record import PassRecord, PassResult
from edgekit.runtime.tokenizer import WORD_START, SentencePieceTokenizer
from edgekit.text.vocab import N_FIXED, build_model_proto, normal_pieces
from edgekit.text.wordpiece import basic_split


@dataclass
class TrimVocabConfig:
    budget: int | None = None  # most pieces in the result, specials and bytes included; None: all task pieces
    max_positions: int | None = None  # also cut the position table to the package's sequence length
    embedding_rank: int | None = None  # also factorise the word embedding to this rank (SVD), None: keep (V, H)
    base_words: int = 0  # also keep the base vocabulary's this many most frequent words (general English)

    def __post_init__(self):
        if self.base_words < 0:
            raise ValueError("base_words must be >= 0")
        if self.embedding_rank is not None and self.embedding_rank < 1:
            raise ValueError("embedding_rank must be >= 1")
        if self.budget is not None and self.budget <= N_FIXED:
            raise ValueError(f"a vocabulary budget must exceed the {N_FIXED} special and byte pieces")


def piece_counts(tok: SentencePieceTokenizer, corpus: list[str]) -> tuple[Counter, set[str]]:
    """Piece frequencies of the tokenizer on the corpus, and the single-character pieces it may need."""
    counts, chars = Counter(), set()
    for text in corpus:
        for word in text.split():
            for p in tok.pieces(word):
                counts[p] += 1
            for t in basic_split(word, tok.lowercase):
                chars.add(WORD_START + t[0])
                chars.update(t[1:])
    return counts, chars


def base_words(tok: SentencePieceTokenizer, n: int) -> list[str]:
    """The first `n` whole-word pieces (two letters or more) of the tokenizer's vocabulary in id order: for a
    vocabulary converted from WordPiece, its `n` most frequent words. Single characters are left out: BERT's
    vocabulary lists a thousand of them (every script's letters) before its first word."""
    words = (p for p in normal_pieces(tok) if p.startswith(WORD_START) and len(p) > 2 and p[1:].isalpha())
    return list(itertools.islice(words, n))


def select_pieces(tok: SentencePieceTokenizer, counts: Counter, chars: set[str], budget: int | None,
                  base: list[str] = ()) -> list[str]:
    """Task pieces and the `base` pieces, in the teacher's id order; under a budget, single characters first, then
    task pieces by frequency, then `base` pieces in their order."""
    vocab = set(normal_pieces(tok))
    used = {p for p in counts if p in vocab}
    singles = {c for c in chars if c in vocab}
    extra = [p for p in base if p not in used and p not in singles]
    keep = used | singles | set(extra)
    if budget is not None and N_FIXED + len(keep) > budget:
        room = budget - N_FIXED - len(singles)
        if room < 0:
            raise ValueError(f"budget {budget} is below the {N_FIXED + len(singles)} special, byte and "
                             "single-character pieces this corpus needs")
        ranked = sorted(used - singles, key=lambda p: (-counts[p], p)) + extra
        keep = singles | set(ranked[:room])
    order = {p: i for i, p in enumerate(normal_pieces(tok))}
    return sorted(keep, key=order.__getitem__)


def agreement(old: SentencePieceTokenizer, new: SentencePieceTokenizer, corpus: list[str]) -> float:
    """Share of utterances whose new piece sequence equals the old one."""
    same = sum(all(old.pieces(w) == new.pieces(w) for w in text.split()) for text in corpus)
    return same / len(corpus)


def trim_vocab(model: JointModel, tokenizer: SentencePieceTokenizer, corpus: list[str],
               cfg: TrimVocabConfig) -> PassResult:
    """Shrink `model`'s embedding to the pieces `tokenizer` (the model's own) produces on `corpus` (task
    utterances). In place; the result carries the new tokenizer."""
    t0 = time.perf_counter()
    tok = tokenizer
    if not corpus:
        raise ValueError("trim_vocab needs a non-empty corpus")
    if model.cfg.vocab_size != tok.vocab_size:
        raise ValueError(f"model has {model.cfg.vocab_size} embedding rows, tokenizer {tok.vocab_size} pieces")
    rec = PassRecord("trim_vocab", params_before=count_params(model), bytes_before=param_bytes(model))
    emb_before = model.word_emb.weight.numel() * model.word_emb.weight.element_size()
    counts, chars = piece_counts(tok, corpus)
    base = base_words(tok, cfg.base_words)
    full = select_pieces(tok, counts, chars, None, base)
    kept = select_pieces(tok, counts, chars, cfg.budget, base) if cfg.budget else full
    new_tok = SentencePieceTokenizer(build_model_proto(kept, tok.lowercase, corpus), tok.lowercase)
    rows = list(range(N_FIXED)) + [tok.sp.piece_to_id(p) for p in kept]
    gather_embeddings(model, rows, cfg.max_positions)
    energy = factorize_embeddings(model, cfg.embedding_rank) if cfg.embedding_rank else None
    full_tok = new_tok if kept is full else SentencePieceTokenizer(build_model_proto(full, tok.lowercase, corpus),
                                                                        tok.lowercase)
    rec.params_after, rec.bytes_after = count_params(model), param_bytes(model)
    rec.extra = {
        "vocab_before": tok.vocab_size,
        "vocab_task": N_FIXED + len(full),  # with the base words
        "base_words": cfg.base_words,
        "base_pieces_added": len(set(kept) - set(counts) - chars),
        "vocab_after": new_tok.vocab_size,
        "budget": cfg.budget,
        "embedding_bytes_before": emb_before,
        "embedding_bytes_after": 4 * (model.word_emb.weight.numel()
                                      + (model.word_proj.weight.numel() if model.word_proj is not None else 0)),
        "embedding_rank": cfg.embedding_rank,
        "svd_energy_kept": energy,
        "tokenization_agreement_full": agreement(tok, full_tok, corpus),
        "tokenization_agreement_budget": agreement(tok, new_tok, corpus) if cfg.budget else None,
        "max_positions": model.cfg.max_positions,
    }
    if rec.extra["tokenization_agreement_full"] < 0.99:
        rec.warnings.append(f"task-vocabulary tokenization matches the teacher's on only "
                            f"{rec.extra['tokenization_agreement_full']:.4f} of utterances")
    rec.seconds = time.perf_counter() - t0
    return PassResult(model, rec, new_tok)
