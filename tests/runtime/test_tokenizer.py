import sys

from edgekit.runtime.decode import spans
from edgekit.runtime.tokenizer import WHITESPACE, split_words
from edgekit.text.wordpiece import WordPieceTokenizer, basic_split

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "play", "queen", "on", "spot", "##ify", "caf", "##e", "!", "u", "##n"]


def tok():
    return WordPieceTokenizer(VOCAB)


def test_basic_split_lowercases_strips_accents_and_splits_punct():
    assert basic_split("Café!") == ["cafe", "!"]
    assert basic_split("\u200bplay") == ["play"]


def test_words_split_on_the_spec_whitespace_set_only():
    """The 29 written-out code points are exactly Python 3.11's str.isspace(); nothing else separates words."""
    assert {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()} == set(WHITESPACE)
    assert [w for w, _, _ in split_words("a\u3000b\u200bc\u00a0d\te\u180ef")] == ["a", "b\u200bc", "d", "e\u180ef"]


def test_encode_marks_first_piece_of_each_word_and_pads():
    enc = tok().encode("play queen on Spotify", 10)
    assert enc.input_ids[:7] == [2, 4, 5, 6, 7, 8, 3] and enc.input_ids[7:] == [0, 0, 0]
    assert enc.attention_mask == [1] * 7 + [0] * 3
    assert enc.word_index[:7] == [-1, 0, 1, 2, 3, -1, -1]
    assert not enc.truncated


def test_unknown_emoji_and_empty_inputs_never_crash():
    t = tok()
    enc = t.encode("play 🎵 東京", 12)
    # [CLS] play [UNK](emoji) [UNK](東) [UNK](京) [SEP]: CJK characters are split one per piece
    assert enc.input_ids[:6] == [2, 4, 1, 1, 1, 3] and enc.word_index[:6] == [-1, 0, 1, 2, -1, -1]
    empty = t.encode("", 8)
    assert empty.input_ids[:2] == [2, 3] and empty.words == []


def test_truncation_cuts_the_last_word_that_fits_to_its_first_pieces():
    enc = tok().encode("play queen on spotify play queen", 6)  # [CLS] play queen on spot [SEP]: "##ify" is cut
    assert enc.truncated and enc.n_words_kept == 4 and sum(enc.attention_mask) == 6
    assert enc.input_ids[:6] == [2, 4, 5, 6, 7, 3] and enc.word_index[:6] == [-1, 0, 1, 2, 3, -1]
    assert enc.kept() == {"chars": 21, "words": 4}  # up to the end of "spotify", the word that was cut


def test_spans_rejoin_words_to_original_text():
    text = "play  queen on spotify"
    words = split_words(text)
    got = spans(words, text, ["O", "B-artist", "O", "B-service"])
    assert got == [{"slot": "artist", "value": "queen", "start": 6, "end": 11},
                   {"slot": "service", "value": "spotify", "start": 15, "end": 22}]
    multi = spans(split_words("the rolling stones"), "the rolling stones", ["O", "B-a", "I-a"])
    assert multi == [{"slot": "a", "value": "rolling stones", "start": 4, "end": 18}]
