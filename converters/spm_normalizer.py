"""Compile BERT's basic pre-tokenizer into a SentencePiece model's own normalizer.

edgekit's runtime runs `basic_split` (clean control characters, lowercase, strip accents, pad CJK characters,
split punctuation) in Python on each whitespace word and only then calls SentencePiece. An app in another
language has to re-implement those steps exactly. This module writes them into the model instead, as a
SentencePiece normalization rule table (`precompiled_charsmap`), so that any SentencePiece implementation given
only `tokenizer.model` produces the runtime's ids: `sp.encode(word) or [unk_id]` for each whitespace word.

The table maps one code point to the text the pre-tokenizer makes of it, with a space on each side of a piece
boundary (" , " for a comma, " 中 " for a CJK character, "" for a control character). The normalizer's own
whitespace handling (drop leading and trailing spaces, collapse runs, add the dummy "▁" prefix) then yields
exactly the string `" ".join(basic_split(word))` gets under the identity normalizer.

Not expressible (see `is_exact` and docs/tokenizer-normalizer.md): U+0000 (a rule key cannot hold a NUL
byte), Greek capital sigma after a cased letter and not before one (Python lowercases it to final ς by context;
the table gives σ), and NFD's reordering of non-Mn combining marks (the table decomposes each character alone).
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
import unicodedata

from edgekit.runtime.tokenizer import _is_cjk, _is_punct, basic_split

MAX_CP = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)  # never in valid text (the runtime's check_text rejects them)
NAME = "edgekit_bert_basic"  # the normalizer spec's name: informative only, the charsmap is what runs


def _drop(ch: str) -> bool:
    """Characters basic_split deletes before anything else."""
    cp = ord(ch)
    return cp == 0 or cp == 0xFFFD or unicodedata.category(ch) in ("Cc", "Cf")


def rule_target(ch: str, lowercase: bool = True) -> str:
    """What the runtime's pre-tokenizer makes of one character, spaces marking piece boundaries.

    Mirrors basic_split step by step and in its order: drop, pad CJK (tested on the original character),
    lowercase + NFD + drop Mn, then pad punctuation (tested after accent stripping). Whitespace, which only
    reaches this table when a whole utterance is encoded at once, becomes a plain space."""
    if ch.isspace():
        return " "  # a word separator (\\S+ never holds one); tab, LF, NBSP, U+3000 ... all unify to " "
    if _drop(ch):
        return ""
    text = f" {ch} " if _is_cjk(ord(ch)) else ch
    if lowercase:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    # basic_split splits on any whitespace the steps above produce (U+2000 -> U+2002 under NFD) and around
    # punctuation; the normalizer only knows " ", so both become spaces.
    return "".join(" " if c.isspace() else f" {c} " if _is_punct(c) else c for c in text)


@functools.lru_cache(maxsize=2)
def normalization_rules(lowercase: bool = True) -> tuple[tuple[int, str], ...]:
    """(code point, target) for every code point the pre-tokenizer changes. U+0000 is left out: the compiled
    trie's keys are NUL-terminated, so no rule can match it (see inexact_chars)."""
    rules = []
    for cp in range(1, MAX_CP + 1):
        if cp in SURROGATES:
            continue
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cn", "Co") and not _is_cjk(cp):
            continue  # unassigned or private use: every step leaves them alone (a fast path, ~1M code points)
        target = rule_target(ch, lowercase)
        if target != ch:
            rules.append((cp, target))
    return tuple(rules)


def rules_tsv(rules) -> str:
    """The rules as SentencePiece's `normalization_rule_tsv` text: source and target code points in hex,
    space-separated, a tab between; an empty target is a deletion rule."""
    return "".join(f"{cp:X}\t{' '.join(f'{ord(c):X}' for c in target)}\n" for cp, target in rules)


@functools.lru_cache(maxsize=2)
def compile_charsmap(lowercase: bool = True) -> bytes:
    """The rules compiled to SentencePiece's `precompiled_charsmap` blob (a double-array trie and the targets).

    SentencePiece compiles a TSV only while training, so this trains a throw-away character model on a
    one-line corpus and keeps its normalizer: the same C++ builder, and a blob every SentencePiece reads."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rules.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(rules_tsv(normalization_rules(lowercase)))
        out = io.BytesIO()
        with open(os.devnull, "w") as quiet:  # the builder logs every load at INFO
            spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c"]), model_writer=out, vocab_size=8,
                                           model_type="char", hard_vocab_limit=False, normalization_rule_tsv=path,
                                           minloglevel=2, logstream=quiet)
    m = pb.ModelProto()
    m.ParseFromString(out.getvalue())
    return m.normalizer_spec.precompiled_charsmap


def compile_normalizer(model_proto: bytes, lowercase: bool = True) -> bytes:
    """`model_proto` (a serialized SentencePiece ModelProto, e.g. a package's tokenizer.model) with the
    pre-tokenizer compiled into its normalizer_spec. Pieces, scores and ids are untouched.

    The whitespace flags stay on, as build_model_proto sets them, because the rules rely on them:
    remove_extra_whitespaces collapses the padding spaces, add_dummy_prefix gives each word its "▁" and
    escape_whitespaces turns the remaining spaces into "▁" piece boundaries."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(model_proto)
    ns = m.normalizer_spec
    ns.Clear()  # drops e.g. a normalization_rule_tsv path: the charsmap is self-contained
    ns.name = NAME
    ns.precompiled_charsmap = compile_charsmap(lowercase)
    ns.add_dummy_prefix, ns.remove_extra_whitespaces, ns.escape_whitespaces = True, True, True
    return m.SerializeToString()


def table_split(word: str, lowercase: bool = True) -> list[str]:
    """basic_split as the compiled table computes it: each character mapped on its own, then split at spaces.
    U+0000 has no rule, so it stays."""
    return [t for t in "".join(c if c == "\0" else rule_target(c, lowercase) for c in word).split(" ") if t]


def is_exact(word: str, lowercase: bool = True) -> bool:
    """Whether the compiled normalizer gives this whitespace word the runtime's pieces (by its text: equal text
    before SentencePiece means equal ids). False only for the context cases listed in the module docstring."""
    return table_split(word, lowercase) == basic_split(word, lowercase)
