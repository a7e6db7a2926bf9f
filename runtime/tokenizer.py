"""The package tokenizer: SentencePiece over whitespace words. This runs on the phone side.

Words are the runs of non-whitespace characters (WHITESPACE below, a fixed set: no Unicode database decides it);
slots are tagged on words. Each word goes through `SentencePieceProcessor.encode` alone and becomes one or more
pieces (none: `<unk>`). The first piece of each word carries that word's slot tag. All normalisation (case,
accents, punctuation, CJK, control characters) is compiled into `tokenizer.model`'s own normalizer at build time
(`edgekit.text.normalizer`), so any SentencePiece implementation given the file gives these ids
(docs/package-format.md).

Bounded work: the text is cut to `max_chars(max_len)` characters before tokenization, then to max_len pieces;
a word longer than what remains keeps its first pieces. So time and memory per call do not grow with the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The 29 code points Python 3.11's str.isspace() accepts, written out so that the word split is the spec's and not
# the interpreter's: U+0009-000D, U+001C-001F, U+0020, U+0085, U+00A0, U+1680, U+2000-200A, U+2028-2029, U+202F,
# U+205F, U+3000.
WHITESPACE = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"
_WORD = re.compile(f"[^{re.escape(WHITESPACE)}]+")
SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]"}  # the manifest's special_ids
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
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


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
    # no kept word gives a piece of its own (none read, or zero-width and control characters only, each [unk]):
    # nothing was said, and the model is not asked (runtime/predictor.py)
    empty: bool = False

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

    def pieceless(self, word: str) -> bool:
        """The word normalizes to nothing (zero-width or control characters only): it stands as [unk]."""
        return False

    def encode(self, text: str, max_len: int) -> Encoding:
        """[CLS] pieces [SEP], padded to max_len. Only the first max_chars(max_len) characters are read; pieces
        past max_len are dropped, a word that does not fit keeps its first pieces (truncated=True)."""
        limit = max_chars(max_len)
        read = check_text(text, limit)  # what is never read cannot matter: the check stays bounded too
        words = split_words(read)
        ids, word_index, kept = [self.cls_id], [-1], 0
        truncated = _WORD.search(text, limit) is not None  # a word character past the limit was not read
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
        empty = all(self.pieceless(word) for word, _, _ in words[:kept])
        return Encoding(ids + [self.pad_id] * pad, [1] * n + [0] * pad, word_index + [-1] * pad, words, kept,
                        truncated, seen, empty)

    def length(self, text: str) -> int:
        """Number of pieces including [CLS] and [SEP], untruncated."""
        return 2 + sum(len(self.word_ids(w)) for w, _, _ in split_words(text))


WORD_START = "\u2581"  # SentencePiece's word-boundary mark


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model whose normalizer holds the pre-tokenizer: `sp.encode(word) or [unk]` per word, in the
    same library Android and iOS apps ship. Byte fallback gives every character pieces; only a word that
    normalizes to nothing (zero-width or control characters only) becomes `<unk>`.

    `lowercase` records how the build compiled the normalizer (the manifest's `tokenizer.lowercase`); the
    model file itself decides the ids."""

    def __init__(self, model_proto: bytes, lowercase: bool = True):
        import sentencepiece as spm

        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.lowercase = lowercase
        ids = {k: self.sp.piece_to_id(name) for k, name in SPECIAL_PIECES.items()}
        if len(set(ids.values())) != 4 or ids["unk"] != self.sp.unk_id():
            raise ValueError("SentencePiece model lacks <pad>, <unk>, [CLS] or [SEP]")
        self.special_ids = ids
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
    def normalizer(self) -> str:
        """The name in the model's normalizer_spec (edgekit's compiled pre-tokenizer: "edgekit_bert_basic")."""
        from sentencepiece import sentencepiece_model_pb2 as pb

        m = pb.ModelProto()
        m.ParseFromString(self.model_proto)
        return m.normalizer_spec.name

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def pieces(self, word: str) -> list[str]:
        return [self.sp.id_to_piece(i) for i in self.word_ids(word)]

    def encode_word(self, word: str) -> list[int]:
        """SentencePiece's ids for a word with U+0000 removed first: the pre-tokenizer drops it as it drops every
        other control character, but the compiled normalizer cannot (its trie's keys are NUL-terminated), so a NUL
        would become a byte piece and "\x00" alone an intent (docs/package-format.md, Tokenization step 3)."""
        return self.sp.encode(word.replace("\x00", "") if "\x00" in word else word)

    def word_ids(self, word: str) -> list[int]:
        """Piece ids for one whitespace word; never empty (an all-control word becomes <unk>)."""
        return self._cache.get(word, self.encode_word) or [self.unk_id]

    def pieceless(self, word: str) -> bool:
        return not self._cache.get(word, self.encode_word)
