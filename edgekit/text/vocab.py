"""Build SentencePiece models from WordPiece vocabularies, through the sentencepiece model proto.

A WordPiece word-start piece `x` becomes `▁x`, a continuation `##x` becomes `x`. The model is a Unigram
model whose scores depend only on a piece's length (word-start pieces weigh far more), so Viterbi picks
the longest word-start piece and then long continuations. Because scores depend on the piece alone,
a model over any subset that still holds every piece used on a corpus segments that corpus exactly as the
full model did: trimming keeps the teacher's tokenization.

Ids 0-3 are <pad>, <unk>, [CLS], [SEP]; 4-259 the 256 byte-fallback pieces; then normal pieces.
"""

from __future__ import annotations

from edgekit.runtime.tokenizer import WORD_START, SentencePieceTokenizer
from edgekit.text.normalizer import ALL, compile_normalizer
from edgekit.text.wordpiece import BERT_SPECIALS

SPECIALS = [("<pad>", "pad"), ("<unk>", "unk"), ("[CLS]", "cls"), ("[SEP]", "sep")]  # SentencePiece piece, role
N_FIXED = len(SPECIALS) + 256


def piece_score(piece: str) -> float:
    """Length-based Unigram score: cubic in length, word-start pieces 100x (longest-match-first behaviour)."""
    return float(len(piece) ** 3 * (100 if piece.startswith(WORD_START) else 1))


def wordpiece_to_sp(piece: str) -> str:
    return piece[2:] if piece.startswith("##") else WORD_START + piece


def build_model_proto(pieces: list[str], lowercase: bool = True, corpus=(), keep=None, cache_dir=None) -> bytes:
    """Serialize a Unigram SentencePiece model: fixed specials and bytes, then `pieces` (SP form, unique), with
    BERT's basic pre-tokenizer compiled into its normalizer (`edgekit.text.normalizer.compile_normalizer`: the CJK
    and Hangul rules for what the pieces and `corpus` can read, or `keep`; `cache_dir` keeps the full table)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    T = pb.ModelProto.SentencePiece
    m = pb.ModelProto()
    for sp_name, _ in SPECIALS:
        m.pieces.add(piece=sp_name, score=0.0, type=T.UNKNOWN if sp_name == "<unk>" else T.CONTROL)
    for b in range(256):
        m.pieces.add(piece=f"<0x{b:02X}>", score=0.0, type=T.BYTE)
    for p in pieces:
        m.pieces.add(piece=p, score=piece_score(p), type=T.NORMAL)
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.UNIGRAM
    ts.vocab_size = len(m.pieces)
    ts.byte_fallback = True
    ts.max_sentencepiece_length = max([16] + [len(p) for p in pieces])
    ts.pad_id, ts.unk_id, ts.bos_id, ts.eos_id = 0, 1, -1, -1
    ts.pad_piece, ts.unk_piece = "<pad>", "<unk>"
    return compile_normalizer(m.SerializeToString(), lowercase, corpus, keep, cache_dir)


def from_wordpiece(vocab: list[str], lowercase: bool = True, cache_dir=None,
                   specials: dict[str, str] | None = None) -> tuple[SentencePieceTokenizer, list[int]]:
    """Convert a whole WordPiece vocab. Returns the tokenizer and, per SentencePiece id, the WordPiece row
    whose embedding it takes (byte pieces take the unknown piece's row: the pretrained model knew them only as
    unknown). `specials`: each role's WordPiece piece (default BERT's; MPNet's cls is <s>): the SentencePiece model
    keeps its own special pieces, which take the rows the base model was trained with."""
    specials = specials or BERT_SPECIALS
    index = {p: i for i, p in enumerate(vocab)}
    missing = [wp for wp in specials.values() if wp not in index]
    if missing:
        raise ValueError(f"vocabulary lacks the special token {missing[0]}")
    pieces, rows, seen = [], [], set()
    for i, p in enumerate(vocab):
        if (len(p) >= 2 and p[0] + p[-1] in ("[]", "<>")) or not p or p == "##":
            continue  # [PAD], [unused7], <s>, <mask>, ...: the pre-tokenizer never makes them; specials have fixed ids
        sp = wordpiece_to_sp(p)
        if sp in seen:
            continue
        seen.add(sp)
        pieces.append(sp)
        rows.append(i)
    fixed = [index[specials[role]] for _, role in SPECIALS] + [index[specials["unk"]]] * 256
    # Every rule: this tokenizer reads any text as the base model's WordPiece did.
    return SentencePieceTokenizer(build_model_proto(pieces, lowercase, keep=ALL, cache_dir=cache_dir), lowercase), fixed + rows


def normal_pieces(tok: SentencePieceTokenizer) -> list[str]:
    return [tok.sp.id_to_piece(i) for i in range(N_FIXED, tok.vocab_size)]
