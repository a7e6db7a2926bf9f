"""A total, bounded runtime (issue 19): every input gets a valid answer, or the documented ValueError, in bounded
time and memory, on both runtimes. A tiny package built once for the module; hypothesis drives arbitrary Unicode."""

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.engine import BuildConfig, build
from edgekit.runtime import Package, Predictor
from edgekit.runtime.package import PackageError
from edgekit.runtime.tokenizer import (
    CACHE_BYTES,
    InputError,
    SentencePieceTokenizer,
    max_chars,
    split_words,
)
from edgekit.text.wordpiece import WordPieceTokenizer

from ..conftest import DEMO
from .test_package_json import resign

RUNTIMES = ("executorch", "onnx")
CALL_BOUND_S = 2.0  # a generous bound on one call (they take milliseconds): it catches work that grows with input


def build_small(out: Path, tiny_bert: Path) -> Path:
    """A small iPhone package (the ios profile: android's passes, ExecuTorch and ONNX Runtime) of the tiny BERT in
    `out`: a SentencePiece vocabulary, one length, both runtimes. Built once
    a test process (in a folder of its own beside the tiny BERT's) and copied to `out` for each module that asks
    (test_contract.py, test_package_json.py, tests/cli/test_cli_fuzz.py too): each may change its copy."""
    import shutil

    built = tiny_bert.parent / f"small-package-of-{tiny_bert.name}"
    if not (built / "manifest.json").is_file():
        build(BuildConfig(data=str(DEMO), out=str(built), base_model=str(tiny_bert), target="ios",
                          stages=["teacher", "trim_vocab", "export", "package"],
                          settings={"teacher": {"epochs": 2, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2},
                                    "package": {"buckets": [], "bench_utterances": 0},  # one length; no latency
                                    "decoding": {"compare_argmax": False}}))
    shutil.copytree(built, out, dirs_exist_ok=True)
    return out


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("bounded"), tiny_bert)


@pytest.fixture(scope="module")
def preds(pkg):
    return {rt: Predictor.open(pkg, rt) for rt in RUNTIMES}


def valid(ans: dict, pred: Predictor, text: str) -> None:
    """The documented answer: a known intent (or oos), a confidence in (0, 1] (0 and oos for a text that says
    nothing: no word read, or none that reaches the model gives a piece), slots that select their value in the text
    read, one tag per word of the text read."""
    assert ans["intent"] in pred.labels["intents"] + ["oos"]
    kept = split_words(text[: max_chars(pred.max_len)])[: pred.tokenizer.encode(text, pred.max_len).n_words_kept]
    if any(pred.tokenizer.encode_word(word) for word, _, _ in kept):  # SentencePiece (NUL removed), not Encoding.empty
        assert 0 < ans["confidence"] <= 1
    else:
        assert ans["intent"] == "oos" and ans["confidence"] == 0.0 and ans["slots"] == []
    read = text[: max_chars(pred.max_len)]
    for s in ans["slots"]:
        assert 0 <= s["start"] < s["end"] <= len(read) and s["value"] == text[s["start"]:s["end"]]
    if "tags" in ans:
        assert len(ans["tags"]) == len(split_words(read))


# -- the cases issue 19 lists under "Runtime behaviour (today)" -------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("long", ["a" * 5000, "北京欢迎你" * 400, "🎵" * 3000])
def test_a_word_longer_than_the_sequence_keeps_its_first_pieces(preds, runtime, long):
    p = preds[runtime]
    enc = p.encode(long, warn=False)
    assert enc.n_words_kept == 1 and sum(enc.attention_mask) == p.max_len  # not "the first 0 words"
    ans = p.predict("play " + long, warn=False)
    valid(ans, p, "play " + long)
    assert ans["truncated"] == {"chars": min(len(long) + 5, max_chars(p.max_len)), "words": 2}
    assert "truncated" not in p.predict("play queen" + " " * 5000, warn=False)  # only spaces past the cap


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_million_characters_cost_what_the_package_reads(preds, runtime):
    p = preds[runtime]
    text = "play some music " * 62_500  # 1 M characters, 187,500 words
    t0 = time.perf_counter()
    ans = p.predict(text, warn=False)
    assert time.perf_counter() - t0 < CALL_BOUND_S
    valid(ans, p, text)
    kept = ans["truncated"]
    assert 0 < kept["words"] < p.max_len and kept["chars"] == len(" ".join(text.split()[: kept["words"]]))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_300_distinct_100k_character_inputs_stay_within_50_mb(preds):
    p = preds["onnx"]
    p.predict("warm up " * 10, warn=False)
    gc.collect()
    start = rss_mb()
    for k in range(300):
        word = f"{k:04d}" + chr(0x4E00 + k) * 99_996  # distinct 100k-character words
        p.predict(word, warn=False)
        del word
    gc.collect()
    assert rss_mb() - start < 50


def test_the_word_cache_is_bounded_in_bytes(preds):
    tok = preds["onnx"].tokenizer
    assert isinstance(tok, SentencePieceTokenizer)  # the fixture trims the vocabulary: a SentencePiece package
    for k in range(60_000):
        tok.word_ids(f"w{k}x{'y' * (k % 50)}")
    assert tok._cache.used <= CACHE_BYTES and 0 < len(tok._cache.data) < 60_000


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_lone_surrogate_is_a_value_error(preds, runtime):
    with pytest.raises(ValueError, match="lone surrogate"):
        preds[runtime].predict("play \ud800 now")
    with pytest.raises(InputError, match="must be a str"):
        preds[runtime].predict(b"play")


def test_invalid_utf8_on_the_command_line_is_one_line_and_exit_2(pkg):
    # argv bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
    r = subprocess.run([sys.executable.encode(), b"-m", b"edgekit.cli", b"predict", str(pkg).encode(), b"play \xff"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: text: text is not valid Unicode")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_empty_allow_intents_is_an_error(preds, runtime):
    with pytest.raises(ValueError, match="non-empty list"):
        preds[runtime].predict("play queen", allow_intents=[])


def test_eval_on_data_whose_labels_the_package_lacks(pkg, tmp_path):
    from edgekit.errors import EdgekitError
    from edgekit.tools.package_eval import evaluate_package

    lines = [json.loads(x) for x in DEMO.read_text().splitlines()]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": x["text"], "intent": "zz_" + x["intent"]}) + "\n" for x in lines))
    with pytest.raises(EdgekitError, match="none of the test split's intents"):
        evaluate_package(pkg, other, "onnx", compare_eager=False)
    half = tmp_path / "half.jsonl"  # one intent renamed: scored, with a loud warning and the count in the output
    first = lines[0]["intent"]
    half.write_text("".join(json.dumps({"text": x["text"], "intent": "zz" if x["intent"] == first else x["intent"]})
                            + "\n" for x in lines))
    out = evaluate_package(pkg, half, "onnx", compare_eager=False)
    assert out["unknown_intents"]["intents"] == ["zz"] and out["unknown_intents"]["utterances"] > 0


def test_wordpiece_tokenizer_is_bounded_too():
    tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "##a"])
    enc = tok.encode("a" * 50, 8)  # 50 pieces: the one word keeps its first 6
    assert enc.input_ids[:8] == [2, 4, 5, 5, 5, 5, 5, 3] and enc.n_words_kept == 1 and enc.truncated


def test_50_byte_flips_in_the_pte_header_with_its_sha256_recomputed_never_crash_the_process(pkg, tmp_path):
    """The loader verifies the program's structure (ExecuTorch's InternalConsistency, and ptefile its segment
    table): a flip in the first 4 KiB gives a clean error or a valid answer. One subprocess runs all 50 (a crash
    would kill it; it says how far it got)."""
    script = tmp_path / "flips.py"
    script.write_text(FLIPS.format(pkg=str(pkg), work=str(tmp_path / "work")))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, (r.returncode, lines[-3:], r.stderr[-2000:])
    results = [json.loads(x) for x in lines if x.startswith("{")]
    assert len(results) == 50 and all(x["outcome"] in ("answer", "error") for x in results)
    assert any(x["outcome"] == "error" for x in results)  # flips in the program's structure are caught
    assert all(x["message"].startswith("model.pte") for x in results if x["outcome"] == "error")


FLIPS = """
import hashlib, json, random, shutil
from pathlib import Path
from edgekit.runtime import Predictor
from edgekit.runtime.package import PackageError

src, work = Path({pkg!r}), Path({work!r})
data = (src / "model.pte").read_bytes()
rng = random.Random(0)
# the first 4 KiB: the header, the program's root tables and its segment table (deeper flips, in an instruction's
# operator index or an XNNPACK payload, can crash ExecuTorch 1.4.1: docs/guarantees.md)
offsets = [rng.randrange(min(4096, len(data))) for _ in range(50)]
for k, off in enumerate(offsets):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    flipped = bytearray(data)
    flipped[off] ^= 1 << rng.randrange(8)
    (work / "model.pte").write_bytes(bytes(flipped))
    man = json.loads((work / "manifest.json").read_text())
    man["files"]["model.pte"]["sha256"] = hashlib.sha256(flipped).hexdigest()  # past the integrity check
    (work / "manifest.json").write_text(json.dumps(man))
    print("flip", k, off, flush=True)
    try:
        ans = Predictor.open(work, "executorch").predict("play queen on spotify", warn=False)
        out = {{"outcome": "answer", "intent": ans["intent"]}}
    except PackageError as e:
        out = {{"outcome": "error", "message": str(e)}}
    print(json.dumps({{"k": k, "offset": off, **out}}), flush=True)
"""


# -- hypothesis: arbitrary Unicode, both runtimes ---------------------------------------------------------------

# Arbitrary code points (controls, NUL, RTL, emoji, surrogates), plus long words built cheaply by repetition.
CHARS = st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)
TEXTS = st.one_of(
    st.text(CHARS, max_size=60),
    st.text(st.sampled_from(list("\u202e\u200f\u0000\t\n\u200b\u00e9\u0301 🎵👩‍👩‍👧東a")), max_size=200),
    st.builds(lambda a, c, n, b: a + c * n + b, st.text(CHARS, max_size=10), st.text(CHARS, min_size=1, max_size=3),
              st.integers(0, 33_000), st.text(CHARS, max_size=10)),
)


def answers_or_value_error(p: Predictor, text: str) -> None:
    t0 = time.perf_counter()
    try:
        ans = p.predict(text, warn=False)
    except ValueError as e:  # documented: text that is not valid Unicode
        assert "lone surrogate" in str(e)
        return
    assert time.perf_counter() - t0 < CALL_BOUND_S
    valid(ans, p, text)


@pytest.mark.parametrize("runtime", RUNTIMES)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow], derandomize=True)
@given(text=TEXTS)
def test_any_unicode_gets_an_answer_or_the_documented_error(preds, runtime, text):
    answers_or_value_error(preds[runtime], text)


def test_a_segment_table_the_serializer_would_not_write_is_one_package_error(pkg, tmp_path):
    """ExecuTorch loads a program whose segment table a flipped bit emptied (offset 0, size 0) and crashes on the
    first call; ptefile refuses it on load. Every bit of the header and of the table (the root's vtable, the
    vector, each segment's table and vtable) flipped in turn: the check refuses the flip, or the table reads the same but for a size within the padding
    before the next segment (which the serializer could have written)."""
    import shutil

    from edgekit.runtime.ptefile import PteError, _alignment, _field, _u, check_table, segments

    data = (pkg / "model.pte").read_bytes()
    program = data[: _u(data, 16, "<Q")]
    table = check_table(data)
    align = _alignment([o for o, _ in table])
    assert len(table) > 2 and table[0][0] == 0
    root = _u(program, 0, "<I")
    at = _field(program, root, 4)  # Program.segments
    vec = at + _u(program, at, "<I")
    vt = root - _u(program, root, "<i")  # the root table's vtable, which says where the segments field is
    spots = set(range(0, 40)) | set(range(vt, vt + _u(program, vt, "<H"))) | set(range(at, at + 4))
    spots |= set(range(vec, vec + 4 + 4 * len(table)))
    for k in range(len(table)):
        item = vec + 4 + 4 * k
        t = item + _u(program, item, "<I")
        vt = t - _u(program, t, "<i")
        spots |= set(range(t, t + 4)) | set(range(vt, vt + _u(program, vt, "<H")))
        spots |= {b for f in (0, 1) if (x := _field(program, t, f)) is not None for b in range(x, x + 8)}
    refused = 0
    for byte in sorted(spots):
        for bit in range(8):
            bad = bytearray(data)
            bad[byte] ^= 1 << bit
            try:
                got = check_table(bytes(bad))
            except PteError:
                refused += 1
                continue
            assert [o for o, _ in got] == [o for o, _ in table] and all(
                abs(a[1] - b[1]) < align for a, b in zip(got, table)), (byte, bit, got[:3])
    assert refused > 0.9 * 8 * len(spots), (refused, len(spots))
    assert segments(program) == table
    bad = bytearray(data)  # the crash found by the byte flips: a segment turned into offset 0, size 0
    pos = _field(program, vec + 8 + _u(program, vec + 8, "<I"), 0)  # segment 1's offset field
    bad[pos:pos + 8] = (0).to_bytes(8, "little")
    work = tmp_path / "p"
    shutil.copytree(pkg, work)
    (work / "model.pte").write_bytes(bytes(bad))
    resign(work)
    with pytest.raises(PackageError, match="model.pte: segment 1 "):
        Package.load(work)