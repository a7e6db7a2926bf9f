"""BERT's basic pre-tokenizer and WordPiece: how the base model's `vocab.txt` reads text. Build side only.

The package never runs this code. `edgekit.text.normalizer` compiles `basic_split` into each SentencePiece model's own
normalizer, so a package's `tokenizer.model` alone gives the build's ids in any SentencePiece implementation.
`WordPieceTokenizer` reads the base model's vocabulary, which `edgekit.text.vocab.from_wordpiece` converts.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

from edgekit.runtime.tokenizer import Tokenizer

BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}  # each role's WordPiece piece


def is_punct(ch: str) -> bool:
    cp = ord(ch)
    # BERT treats all non-alphanumeric ASCII as punctuation, plus Unicode P* categories.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_split(word: str, lowercase: bool = True) -> list[str]:
    """BERT's basic tokenizer on one whitespace word: clean, lowercase, strip accents, split punctuation."""
    chars = []
    for ch in word:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or unicodedata.category(ch) in ("Cc", "Cf"):
            continue
        chars.append(f" {ch} " if is_cjk(cp) else ch)
    text = "".join(chars)
    if lowercase:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    out: list[str] = []
    for tok in text.split():
        cur = ""
        for ch in tok:
            if is_punct(ch):
                if cur:
                    out.append(cur)
                    cur = ""
                out.append(ch)
            else:
                cur += ch
        if cur:
            out.append(cur)
    return out



class WordPieceTokenizer(Tokenizer):
    """Greedy longest-match WordPiece over a BERT `vocab.txt`, with BERT's basic pre-tokenizer. `specials`: the
    pad, unk, cls and sep pieces (default BERT's; MPNet's are <pad>, [UNK], <s>, </s>)."""

    def __init__(self, vocab: list[str], lowercase: bool = True, max_chars_per_word: int = 100,
                 specials: dict[str, str] | None = None):
        self.vocab = vocab
        self.index = {p: i for i, p in enumerate(vocab)}
        specials = specials or BERT_SPECIALS
        for s in specials.values():
            if s not in self.index:
                raise ValueError(f"vocabulary lacks the special token {s}")
        self.lowercase = lowercase
        self.max_chars = max_chars_per_word
        self.pad_id, self.unk_id = self.index[specials["pad"]], self.index[specials["unk"]]
        self.cls_id, self.sep_id = self.index[specials["cls"]], self.index[specials["sep"]]

    @classmethod
    def from_file(cls, path: str | Path, lowercase: bool = True,
                  specials: dict[str, str] | None = None) -> "WordPieceTokenizer":
        """Load a `vocab.txt` (one piece per line, the line number is the id)."""
        vocab = Path(path).read_text(encoding="utf-8").split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        return cls(vocab, lowercase, specials=specials)

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(p + "\n" for p in self.vocab), encoding="utf-8")

    def _wordpiece(self, token: str) -> list[int]:
        if len(token) > self.max_chars:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(token):
            end, found = len(token), None
            while start < end:
                piece = token[start:end] if start == 0 else "##" + token[start:end]
                if piece in self.index:
                    found = self.index[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            ids.append(found)
            start = end
        return ids

    def word_ids(self, word: str) -> list[int]:
        """Piece ids for one whitespace word; never empty (an all-control word becomes [UNK])."""
        ids = [i for tok in basic_split(word, self.lowercase) for i in self._wordpiece(tok)]
        return ids or [self.unk_id]
