"""The pre-tokenizer compiled into the SentencePiece normalizer gives the runtime's ids from tokenizer.model alone."""

import shutil
import subprocess
import unicodedata

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from edgekit.converters.spm_normalizer import compile_normalizer, is_exact, normalization_rules, table_split
from edgekit.runtime.tokenizer import basic_split, split_words
from edgekit.vocab import from_wordpiece

from ..conftest import make_vocab

# accents and case, apostrophes and times, emoji, CJK, tabs and runs of spaces, zero-width and control characters
HARD = [
    "Beyoncé", "CAFÉ", "cafe\u0301", "Crème Brûlée", "naïve", "İstanbul", "straße", "Ἀθῆναι", "Tiếng Việt",
    "don't", "6:30pm", "rock'n'roll", "U.S.A.", "e-mail", "$100", "50%", "#tag", "@user", "a.b,c;d", "...",
    "“quoted”", "«guillemets»", "1,000.50", "(paren)", "back\\slash", "under_score", "emoji 😀👍🏽", "❤️",
    "👨‍👩‍👧", "🇺🇸", "中文", "我想订一张去北京的机票", "日本語テキスト", "한국어", "𠀀𪜀", "豈", "ＦＵＬＬＷＩＤＴＨ",
    "Ⅻ", "ﬁ", "𝐁𝐨𝐥𝐝", "ǅ", "नमस्ते", "مرحبا", "x\u0308\u0301", "tab\tseparated", "multiple   spaces",
    "  leading and trailing  ", "zero\u200bwidth", "soft\u00adhyphen", "bidi\u200emark", "\ufeffbom",
    "ctrl\x07char", "esc\x1b[0m", "rep\ufffdchar", "nbsp\u00a0space", "ideographic\u3000space", "line\u2028sep",
    "en\u2000quad", "\u200b", "\x07", "▁already▁marked", "play Beyoncé's \"Halo\" at 6:30pm, please!",
    "Σ", "ΣΑ", "σς",
]
# Context-dependent in Python, per character in the table (docs/tokenizer-normalizer.md, "Exceptions").
INEXACT = ["nul\x00char", "ΟΔΟΣ", "ΑΣ-", "\U0001D16D\U0001D165"]
WORDS = ["play", "cafe", "beyonce", "don", "pm", "please", "halo", "中", "文", "σ", "ς", "α", "ο", "δ", "é"]


@pytest.fixture(scope="module", params=[True, False], ids=["lowercase", "cased"])
def models(request):
    """The runtime's tokenizer over a tiny vocab, and the same model with the normalizer compiled in."""
    old, _ = from_wordpiece(make_vocab(WORDS), lowercase=request.param)
    proto = compile_normalizer(old.model_proto, old.lowercase)
    return old, spm.SentencePieceProcessor(model_proto=proto), proto


def words_of(texts):
    return [w for t in texts for w, _, _ in split_words(t)]


def test_per_word_ids_equal_runtime(models):
    old, new, _ = models
    for w in words_of(HARD):
        assert (new.encode(w) or [new.unk_id()]) == old.word_ids(w), repr(w)
        assert is_exact(w, old.lowercase), repr(w)


def test_known_inexact_cases_are_flagged(models):
    old, new, _ = models
    for w in INEXACT:
        if old.lowercase or "\0" in w:  # sigma and mark reordering come from lowercasing and NFD
            assert not is_exact(w, old.lowercase), repr(w)
            assert new.encode(w) != old.word_ids(w), repr(w)


def test_whole_utterance_is_the_concatenation_except_empty_words(models):
    old, new, _ = models
    for t in HARD:
        words = [w for w, _, _ in split_words(t) if basic_split(w, old.lowercase)]  # an all-control word: [unk]
        assert new.encode(t) == [i for w in words for i in old.word_ids(w)], repr(t)


def test_table_matches_basic_split_on_single_characters():
    """Every assigned BMP character and every ruled one beyond: the table stays in step with basic_split."""
    for lowercase in (True, False):
        beyond = [cp for cp, _ in normalization_rules(lowercase) if cp > 0xFFFF]
        for cp in [*range(1, 0xD800), *range(0xE000, 0x10000), *beyond[::7]]:
            ch = chr(cp)
            if not ch.isspace() and unicodedata.category(ch) not in ("Cn", "Co"):
                assert table_split(ch, lowercase) == basic_split(ch, lowercase), hex(cp)


def test_model_keeps_pieces_and_carries_no_paths(models):
    old, new, proto = models
    a, b = pb.ModelProto(), pb.ModelProto()
    a.ParseFromString(old.model_proto)
    b.ParseFromString(proto)
    assert list(a.pieces) == list(b.pieces) and a.trainer_spec == b.trainer_spec
    ns = b.normalizer_spec
    assert ns.precompiled_charsmap and not ns.normalization_rule_tsv
    assert ns.add_dummy_prefix and ns.remove_extra_whitespaces and ns.escape_whitespaces
    assert compile_normalizer(proto, old.lowercase) == proto  # idempotent: safe to re-run on a package model


@pytest.mark.skipif(shutil.which("spm_encode") is None,
                    reason="spm_encode (C++ SentencePiece, e.g. Debian's `sentencepiece` package) is not on PATH")
def test_cpp_spm_encode_gives_the_same_ids(models, tmp_path):
    old, new, proto = models
    model = tmp_path / "tokenizer.model"
    model.write_bytes(proto)
    words = words_of(HARD)
    src = tmp_path / "words.txt"
    src.write_text("".join(w + "\n" for w in words), encoding="utf-8")
    out = subprocess.run(["spm_encode", "--model", str(model), "--output_format", "id", "--input", str(src)],
                         capture_output=True, check=True, timeout=60).stdout.decode()
    got = [[int(i) for i in line.split()] for line in out.split("\n")[:len(words)]]
    assert len(got) == len(words)
    for w, ids in zip(words, got):
        assert (ids or [new.unk_id()]) == old.word_ids(w), repr(w)
