"""Compile BERT's basic pre-tokenizer into a SentencePiece model's own normalizer.

The base model reads text through `basic_split` (clean control characters, lowercase, strip accents, pad CJK
characters, split punctuation), then WordPiece. Every SentencePiece model edgekit writes (`edgekit.text.vocab`) holds
those steps instead, as a SentencePiece normalization rule table (`precompiled_charsmap`), so that any
SentencePiece implementation given only `tokenizer.model` produces the build's ids: `sp.encode(word) or [unk_id]`
for each whitespace word. The runtime does exactly that and nothing else.

The table maps one code point to the text the pre-tokenizer makes of it, with a space on each side of a piece
boundary (" , " for a comma, " 中 " for a CJK character, "" for a control character). The normalizer's own
whitespace handling (drop leading and trailing spaces, collapse runs, add the dummy "▁" prefix) then yields
exactly the string `" ".join(basic_split(word))` gets under the identity normalizer.

Size: two scripts take one rule per character, CJK ideographs (padding, 81,520 rules) and Hangul syllables
(NFD into jamo, 11,172): 1.2 MB of the 1.4 MB table. A package's table keeps those rules only for the characters
of these scripts that its pieces or its build corpus can read (`script_chars`); any other one is unknown to the
model either way (byte pieces) and is left as it is, which docs/tokenizer-normalizer.md lists as an exception.

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
from pathlib import Path

from edgekit.runtime.tokenizer import SentencePieceTokenizer, Tokenizer
from edgekit.text.wordpiece import basic_split, is_cjk, is_punct

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
    text = f" {ch} " if is_cjk(ord(ch)) else ch
    if lowercase:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    # basic_split splits on any whitespace the steps above produce (U+2000 -> U+2002 under NFD) and around
    # punctuation; the normalizer only knows " ", so both become spaces.
    return "".join(" " if c.isspace() else f" {c} " if is_punct(c) else c for c in text)


@functools.lru_cache(maxsize=2)
def normalization_rules(lowercase: bool = True) -> tuple[tuple[int, str], ...]:
    """(code point, target) for every code point the pre-tokenizer changes. U+0000 is left out: the compiled
    trie's keys are NUL-terminated, so no rule can match it (see inexact_chars)."""
    rules = []
    for cp in range(1, MAX_CP + 1):
        if cp in SURROGATES:
            continue
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cn", "Co") and not is_cjk(cp):
            continue  # unassigned or private use: every step leaves them alone (a fast path, ~1M code points)
        target = rule_target(ch, lowercase)
        if target != ch:
            rules.append((cp, target))
    return tuple(rules)


def rules_tsv(rules) -> str:
    """The rules as SentencePiece's `normalization_rule_tsv` text: source and target code points in hex,
    space-separated, a tab between; an empty target is a deletion rule."""
    return "".join(f"{cp:X}\t{' '.join(f'{ord(c):X}' for c in target)}\n" for cp, target in rules)


ALL = "all"  # every rule (the base vocabulary's tokenizer: exact, 1.4 MB)
HANGUL = range(0xAC00, 0xD7A4)  # precomposed syllables: NFD gives conjoining jamo (Lo, kept), so each has a rule


def per_char_script(cp: int) -> bool:
    """The two scripts whose rules are one per character, and many: CJK ideographs and Hangul syllables."""
    return is_cjk(cp) or cp in HANGUL


def script_chars(texts, lowercase: bool = True) -> frozenset[int]:
    """The CJK ideographs and Hangul syllables a model over `texts` (its pieces, its corpus) can read: those in
    the texts, and those whose rule's target is made of characters in them (a syllable whose jamo all are, a
    compatibility ideograph whose canonical one is)."""
    chars = {c for t in texts for c in t}
    return frozenset(cp for cp, target in normalization_rules(lowercase) if per_char_script(cp)
                     and (chr(cp) in chars or set(target.replace(" ", "")) <= chars))


def package_rules(lowercase: bool, keep) -> tuple[tuple[int, str], ...]:
    """normalization_rules, with the per-character scripts' rules only for the code points in `keep` (`ALL`:
    every rule)."""
    rules = normalization_rules(lowercase)
    return rules if keep == ALL else tuple(r for r in rules if not per_char_script(r[0]) or r[0] in keep)


def compile_charsmap(lowercase: bool = True, keep=ALL, cache_dir: Path | None = None) -> bytes:
    """The rules compiled to SentencePiece's `precompiled_charsmap` blob (a double-array trie and the targets).
    With `cache_dir`, the full table (`ALL`, ~3 s to make) is kept there, keyed by everything it depends on."""
    if keep != ALL or cache_dir is None:
        return _compile(lowercase, keep)
    import sentencepiece as spm

    from edgekit import __version__

    # one folder per key, as a stage-cache entry (`edgekit cache ls` lists it, `prune` removes it)
    path = Path(cache_dir) / (f"charsmap-{__version__}-unicode{unicodedata.unidata_version}-spm{spm.__version__}-"
                              f"{'uncased' if lowercase else 'cased'}") / "charsmap.bin"
    if path.is_file():
        return path.read_bytes()
    blob = _compile(lowercase, keep)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(path)  # atomic: parallel builds may race to write the same bytes
    except OSError:  # a read-only cache: compiled again next time (a second); the build says so if it must write
        pass
    return blob


@functools.lru_cache(maxsize=8)
def _compile(lowercase: bool, keep) -> bytes:
    """SentencePiece compiles a TSV only while training, so this trains a throw-away character model on a
    one-line corpus and keeps its normalizer: the same C++ builder, and a blob every SentencePiece reads."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rules.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(rules_tsv(package_rules(lowercase, keep)))
        out = io.BytesIO()
        with open(os.devnull, "w") as quiet:  # the builder logs every load at INFO
            spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c"]), model_writer=out, vocab_size=8,
                                           model_type="char", hard_vocab_limit=False, normalization_rule_tsv=path,
                                           minloglevel=2, logstream=quiet)
    m = pb.ModelProto()
    m.ParseFromString(out.getvalue())
    return m.normalizer_spec.precompiled_charsmap


def compile_normalizer(model_proto: bytes, lowercase: bool = True, corpus=(), keep=None,
                       cache_dir: Path | None = None) -> bytes:
    """`model_proto` (a serialized SentencePiece ModelProto) with the pre-tokenizer compiled into its
    normalizer_spec. Pieces, scores and ids are untouched. The CJK and Hangul rules cover what the model's pieces
    and `corpus` (the build's texts) can read (`script_chars`), or `keep` when given (`ALL`: every rule).

    `cache_dir`: where the full table is kept between processes (compile_charsmap).

    The whitespace flags are set on, because the rules rely on them:
    remove_extra_whitespaces collapses the padding spaces, add_dummy_prefix gives each word its "▁" and
    escape_whitespaces turns the remaining spaces into "▁" piece boundaries."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(model_proto)
    if keep is None:
        keep = script_chars([p.piece for p in m.pieces] + list(corpus), lowercase)
    ns = m.normalizer_spec
    ns.Clear()  # drops e.g. a normalization_rule_tsv path: the charsmap is self-contained
    ns.name = NAME
    ns.precompiled_charsmap = compile_charsmap(lowercase, keep, cache_dir)
    ns.add_dummy_prefix, ns.remove_extra_whitespaces, ns.escape_whitespaces = True, True, True
    return m.SerializeToString()


def table_split(word: str, lowercase: bool = True, keep=ALL) -> list[str]:
    """basic_split as the compiled table computes it: each character mapped on its own, then split at spaces.
    U+0000 has no rule, nor CJK or Hangul characters outside `keep`, so they stay."""
    def one(c: str) -> str:
        kept = keep == ALL or not per_char_script(ord(c)) or ord(c) in keep
        return rule_target(c, lowercase) if kept and c != "\0" else c

    return [t for t in "".join(map(one, word)).split(" ") if t]


def is_exact(word: str, lowercase: bool = True, keep=ALL) -> bool:
    """Whether the compiled normalizer gives this whitespace word basic_split's pieces (by its text: equal text
    before SentencePiece means equal ids). False only for the cases listed in the module docstring."""
    return table_split(word, lowercase, keep) == basic_split(word, lowercase)


class ReferenceTokenizer(Tokenizer):
    """What the compiled table stands for: `basic_split` in Python, then the same pieces under the identity
    normalizer (the runtime's path before schema 2). The measure the tests and examples/spm_normalizer_check.py
    hold the compiled model to."""

    def __init__(self, tok: SentencePieceTokenizer):
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        m.ParseFromString(tok.model_proto)
        m.normalizer_spec.Clear()
        ns = m.normalizer_spec
        ns.name, ns.add_dummy_prefix, ns.remove_extra_whitespaces, ns.escape_whitespaces = "identity", True, True, True
        self.sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
        self.lowercase = tok.lowercase
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id

    def word_ids(self, word: str) -> list[int]:
        toks = basic_split(word, self.lowercase)
        return (self.sp.encode(" ".join(toks)) if toks else []) or [self.unk_id]
