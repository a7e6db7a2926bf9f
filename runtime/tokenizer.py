"""Tokenizers that ship inside a package. Pure Python: this runs on the phone side.

Words are split on whitespace (the unit slots are tagged on); each word becomes one or more
pieces. The first piece of each word carries that word's slot tag.

Bounded work: the text is cut to `max_chars(max_len)` characters before tokenization, then to max_len pieces;
a word longer than what remains keeps its first pieces. So time and memory per call do not grow with the input.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
_WS = re.compile(r"\S+")
CHARS_PER_POSITION = 32  # characters read per sequence position: far above any real text's ~5 per piece
CACHE_BYTES = 4 << 20  # the per-word piece cache's budget (a long-lived Predictor stays flat)
CACHE_WORD_CHARS = 64  # longer words are not cached: they are rare, and would fill the budget


class InputError(ValueError):
    """Text the runtime cannot take (not a str, or not valid Unicode); the CLI prints it as one line."""


def max_chars(max_len: int) -> int:
    """The characters of an utterance that are read: the rest cannot reach the model's max_len positions."""
    return CHARS_PER_POSITION * max_len


def check_text(text, limit: int | None = None) -> str:
    """`text[:limit]`, the part that is read; InputError unless `text` is a str and that part encodes as UTF-8
    (no lone surrogates)."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    read = text[:limit]
    try:
        read.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"text is not valid Unicode: a lone surrogate {read[e.start]!r} at character {e.start}"
                         ) from None
    return read


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


class WordCache:
    """word -> piece ids, bounded in bytes (cleared when full: cheap, and a phone's working set of words refills
    it in a few calls). Words over CACHE_WORD_CHARS are not kept: they are rare and would fill the budget."""

    def __init__(self, budget: int = CACHE_BYTES):
        self.budget, self.used, self.data = budget, 0, {}

    def get(self, word: str, compute) -> list[int]:
        ids = self.data.get(word)
        if ids is None:
            ids = compute(word)
            if len(word) <= CACHE_WORD_CHARS:
                cost = 100 + 4 * len(word) + 36 * len(ids)  # the str, the list and its ints, the dict slot
                if self.used + cost > self.budget:
                    self.data.clear()
                    self.used = 0
                self.data[word] = ids
                self.used += cost
        return ids


@dataclass
class Encoding:
    """One tokenized utterance, padded to `max_len`."""

    input_ids: list[int]  # (max_len,)
    attention_mask: list[int]  # (max_len,)
    word_index: list[int]  # (max_len,) word number for the first piece of each word, else -1
    words: list[tuple[str, int, int]]  # the words of the text read (its first max_chars), with character spans
    n_words_kept: int  # words whose first piece fits inside max_len (the last may be cut to its first pieces)
    truncated: bool
    chars_read: int = 0  # the text up to here reached the model: the end of its last kept word

    def kept(self) -> dict:
        """How much of a truncated text the answer saw: {"chars": the end of the last word that reached the model,
        "words": how many words did} (the last one may be cut to its first pieces)."""
        return {"chars": self.chars_read, "words": self.n_words_kept}


class Tokenizer:
    """Shared encoding: subclasses map one whitespace word to piece ids (`word_ids`)."""

    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int

    def word_ids(self, word: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str, max_len: int) -> Encoding:
        """[CLS] pieces [SEP], padded to max_len. Only the first max_chars(max_len) characters are read; pieces
        past max_len are dropped, a word that does not fit keeps its first pieces (truncated=True)."""
        limit = max_chars(max_len)
        read = check_text(text, limit)  # what is never read cannot matter: the check stays bounded too
        words = split_words(read)
        ids, word_index, kept = [self.cls_id], [-1], 0
        truncated = len(text) > limit and not text[limit:].isspace()
        for w, (word, _, _) in enumerate(words):
            pieces = self.word_ids(word)
            room = max_len - 1 - len(ids)
            if len(pieces) > room:
                truncated = True
                if room > 0:  # a word longer than what remains keeps its first pieces
                    word_index += [w] + [-1] * (room - 1)
                    ids += pieces[:room]
                    kept += 1
                break
            word_index += [w] + [-1] * (len(pieces) - 1)
            ids += pieces
            kept += 1
        ids.append(self.sep_id)
        word_index.append(-1)
        n = len(ids)
        pad = max_len - n
        seen = words[kept - 1][2] if kept else 0  # the end of the last word that reached the model
        return Encoding(ids + [self.pad_id] * pad, [1] * n + [0] * pad, word_index + [-1] * pad, words, kept,
                        truncated, seen)

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
        self._cache = WordCache()

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
        return self._cache.get(word, self._encode_word)

    def _encode_word(self, word: str) -> list[int]:
        toks = basic_split(word, self.lowercase)
        return (self.sp.encode(" ".join(toks)) if toks else []) or [self.unk_id]
