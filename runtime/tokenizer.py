"""Tokenizers that ship inside a package. Pure Python: this runs on the phone side.

Words are split on whitespace (the unit slots are tagged on); each word becomes one or more
pieces. The first piece of each word carries that word's slot tag.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
_WS = re.compile(r"\S+")


def split_words(text: str) -> list[tuple[str, int, int]]:
    """Split text on whitespace into (word, start, end) character spans."""
    return [(m.group(), m.start(), m.end()) for m in _WS.finditer(text)]


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    # BERT treats all non-alphanumeric ASCII as punctuation, plus Unicode P* categories.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_split(word: str, lowercase: bool = True) -> list[str]:
    """BERT's basic tokenizer on one whitespace word: clean, lowercase, strip accents, split punctuation."""
    chars = []
    for ch in word:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or unicodedata.category(ch) in ("Cc", "Cf"):
            continue
        chars.append(f" {ch} " if _is_cjk(cp) else ch)
    text = "".join(chars)
    if lowercase:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    out: list[str] = []
    for tok in text.split():
        cur = ""
        for ch in tok:
            if _is_punct(ch):
                if cur:
                    out.append(cur)
                    cur = ""
                out.append(ch)
            else:
                cur += ch
        if cur:
            out.append(cur)
    return out


@dataclass
class Encoding:
    """One tokenized utterance, padded to `max_len`."""

    input_ids: list[int]  # (max_len,)
    attention_mask: list[int]  # (max_len,)
    word_index: list[int]  # (max_len,) word number for the first piece of each word, else -1
    words: list[tuple[str, int, int]]  # all words of the text, with character spans
    n_words_kept: int  # words that fit inside max_len
    truncated: bool


class Tokenizer:
    """Shared encoding: subclasses map one whitespace word to piece ids (`word_ids`)."""

    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int

    def word_ids(self, word: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str, max_len: int) -> Encoding:
        """[CLS] pieces [SEP], padded to max_len. Words past max_len are dropped (truncated=True)."""
        words = split_words(text)
        ids, word_index, kept, truncated = [self.cls_id], [-1], 0, False
        for w, (word, _, _) in enumerate(words):
            pieces = self.word_ids(word)
            if len(ids) + len(pieces) > max_len - 1:
                truncated = True
                break
            word_index += [w] + [-1] * (len(pieces) - 1)
            ids += pieces
            kept += 1
        ids.append(self.sep_id)
        word_index.append(-1)
        n = len(ids)
        pad = max_len - n
        return Encoding(ids + [self.pad_id] * pad, [1] * n + [0] * pad, word_index + [-1] * pad, words, kept,
                        truncated)

    def length(self, text: str) -> int:
        """Number of pieces including [CLS] and [SEP], untruncated."""
        return 2 + sum(len(self.word_ids(w)) for w, _, _ in split_words(text))


class WordPieceTokenizer(Tokenizer):
    """Greedy longest-match WordPiece over a BERT `vocab.txt`, with BERT's basic pre-tokenizer."""

    def __init__(self, vocab: list[str], lowercase: bool = True, max_chars_per_word: int = 100):
        self.vocab = vocab
        self.index = {p: i for i, p in enumerate(vocab)}
        for s in SPECIALS:
            if s not in self.index:
                raise ValueError(f"vocabulary lacks the special token {s}")
        self.lowercase = lowercase
        self.max_chars = max_chars_per_word
        self.pad_id, self.unk_id = self.index["[PAD]"], self.index["[UNK]"]
        self.cls_id, self.sep_id = self.index["[CLS]"], self.index["[SEP]"]

    @classmethod
    def from_file(cls, path: str | Path, lowercase: bool = True) -> "WordPieceTokenizer":
        """Load a `vocab.txt` (one piece per line, the line number is the id)."""
        vocab = Path(path).read_text(encoding="utf-8").split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        return cls(vocab, lowercase)

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


WORD_START = "\u2581"  # SentencePiece's word-boundary mark


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model behind BERT's basic pre-tokenizer.

    Each whitespace word is cleaned, lowercased and split at punctuation as BERT does (pure Python, a few
    lines in any app language); the pieces joined by spaces go through `SentencePieceProcessor.encode`,
    the same library Android and iOS apps ship. Byte fallback means no input becomes a bare unknown.
    """

    def __init__(self, model_proto: bytes, lowercase: bool = True):
        import sentencepiece as spm

        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.lowercase = lowercase
        ids = {name: self.sp.piece_to_id(name) for name in ("<pad>", "<unk>", "[CLS]", "[SEP]")}
        if len(set(ids.values())) != 4 or ids["<unk>"] != self.sp.unk_id():
            raise ValueError("SentencePiece model lacks <pad>, <unk>, [CLS] or [SEP]")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = ids.values()
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_file(cls, path: str | Path, lowercase: bool = True) -> "SentencePieceTokenizer":
        return cls(Path(path).read_bytes(), lowercase)

    def save(self, path: str | Path) -> None:
        tmp = Path(path).with_name(Path(path).name + ".tmp")
        tmp.write_bytes(self.model_proto)
        tmp.replace(path)  # atomic: a reader never sees half a model

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def pieces(self, word: str) -> list[str]:
        return [self.sp.id_to_piece(i) for i in self.word_ids(word)]

    def word_ids(self, word: str) -> list[int]:
        """Piece ids for one whitespace word; never empty (an all-control word becomes <unk>)."""
        ids = self._cache.get(word)
        if ids is None:
            toks = basic_split(word, self.lowercase)
            ids = self.sp.encode(" ".join(toks)) if toks else []
            ids = ids or [self.unk_id]
            if len(self._cache) < 100_000:
                self._cache[word] = ids
        return ids
