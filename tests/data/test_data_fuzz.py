"""Fuzzing the dataset readers: whatever the bytes, load_dataset returns a Dataset or raises an EdgekitError
(which the CLI prints as one line), never another exception.

Inputs are random bytes, and valid files of each format (mostly valid: the shapes users export) spoiled now and
then: a UTF-8 byte order mark, CRLF or CR line endings, latin-1 bytes inside UTF-8, a garbage line, an odd
value. Each test writes into its own temporary folder (no function-scoped fixture: hypothesis reuses one across
examples) and keeps no example database.
"""

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.data.dataset import Dataset, check_trainable, load_dataset
from edgekit.errors import EdgekitError

FUZZ = settings(max_examples=200, deadline=None, database=None, derandomize=True,  # the same inputs in every run
               suppress_health_check=[HealthCheck.too_slow])
BOM = b"\xef\xbb\xbf"


def mostly(good, bad, odds: int = 6):
    """`good`, and once in `odds + 1` draws `bad`: a valid file with the odd spoiled value, not garbage throughout."""
    return st.sampled_from([good] * odds + [bad]).flatmap(lambda s: s)


WORD = st.sampled_from(["play", "queen", "café", "naïve", "😀", "a,b", '"q"', "tonight", "7pm", "queen,", "(abba)"])
WORDS = st.lists(WORD, min_size=1, max_size=5)
TEXT = mostly(WORDS.map(" ".join), st.text(max_size=12) | st.sampled_from(["", " ", "\u2028", "a\x85b", "\t"]))
INTENT = mostly(st.sampled_from(["music", "call", "stop"]), st.sampled_from(["", " ", "oos"]) | st.text(max_size=4))
SPLIT = mostly(st.sampled_from(["train", "dev", "val", "test", "TEST ", ""]), st.just("nope"))
GARBAGE = st.text(max_size=20) | st.sampled_from(["{", "[1e999999999]", '{"text": 1}', '"', "a,b,c,d", "\x00"])


@st.composite
def spoiled(draw, lines: list[str]) -> bytes:
    """Lines with a drawn line ending, maybe behind a BOM; now and then a garbage line or latin-1 bytes."""
    lines = list(lines)
    if lines and draw(mostly(st.just(False), st.just(True), odds=7)):
        lines[draw(st.integers(0, len(lines) - 1))] = draw(GARBAGE)
    data = draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines).encode()
    if draw(st.booleans()):
        data += b"\n"
    if draw(st.booleans()):
        data = BOM + data
    for _ in range(draw(st.sampled_from([0] * 8 + [1, 2]))):  # a latin-1 byte (é, ï, NBSP) where UTF-8 was expected
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xe9", b"\xef", b"\xa0"])) + data[at:]
    return data


def write(folder: str, name: str, data: bytes) -> Path:
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def check(path: Path, fmt: str | None = None) -> bool:
    """The property: a well-formed Dataset, or an EdgekitError. True when a Dataset came back."""
    try:
        ds = load_dataset(path, fmt)
    except EdgekitError:
        return False
    assert isinstance(ds, Dataset)
    for split in ds.splits.values():
        for ex in split:
            assert ex.words and all(w and not w.isspace() for w in ex.words) and ex.intent
            assert ex.tags is None or len(ex.tags) == len(ex.words)
            assert "\ufeff" not in ex.text
    try:
        check_trainable(ds)
    except EdgekitError:
        pass
    return True


@FUZZ
@given(st.sampled_from(["d.csv", "d.tsv", "d.jsonl", "d.json", "d.txt"]), st.binary(max_size=300))
def test_random_bytes_in_a_file(name, data):
    with tempfile.TemporaryDirectory() as tmp:
        check(write(tmp, name, data))
        check(write(tmp, name, BOM + data))


COLUMN = st.sampled_from(["text", "label", "split", "Label", " TEXT ", "utterance", "intent", "", "x"])
HEADER = mostly(st.sampled_from([["text", "label"], ["query", "intent", "split"], ["id", "sentence", "category"]]),
                st.lists(COLUMN, min_size=1, max_size=4))
CELLS = {"text": TEXT, "query": TEXT, "sentence": TEXT, "label": INTENT, "intent": INTENT, "category": INTENT,
         "split": SPLIT}


@FUZZ
@given(HEADER, st.data())
def test_csv(header, data):
    def row():
        cells = [data.draw(CELLS.get(c.strip().lower(), GARBAGE)) for c in header]
        cells += data.draw(mostly(st.just([]), st.lists(TEXT, min_size=1, max_size=1)))  # now and then a field too many
        return ",".join('"' + c.replace('"', '""') + '"' if data.draw(st.booleans()) else c for c in cells)

    lines = [",".join(header)] + [row() for _ in range(data.draw(st.integers(0, 8)))]
    with tempfile.TemporaryDirectory() as tmp:
        check(write(tmp, "d.csv", data.draw(spoiled(lines))))


@st.composite
def jsonl_row(draw) -> dict:
    """A row with character spans on whole words, now and then off by one (inside a word, or on punctuation)."""
    words = draw(WORDS)
    text = " ".join(words)
    row = {"text": text, "intent": draw(INTENT)}
    if draw(st.booleans()):
        spans, at = [], 0
        for w in words:
            if draw(st.integers(0, 2)) == 0:
                start, end = at + draw(mostly(st.just(0), st.integers(-1, 1))), at + len(w) + draw(
                    mostly(st.just(0), st.integers(-1, 1)))
                slot = draw(mostly(st.sampled_from(["artist", "time"]), st.sampled_from(["", " "]) | st.integers()))
                spans.append({"start": start, "end": end, "slot": slot})
            at += len(w) + 1
        row["slots"] = draw(mostly(st.just(spans), st.none() | st.integers() | st.just([{"start": True}])))
    if draw(st.booleans()):
        row["split"] = draw(SPLIT)
    if draw(mostly(st.just(False), st.just(True), odds=9)):  # an odd type where a string belongs
        row[draw(st.sampled_from(["text", "intent", "split"]))] = draw(st.integers() | st.none() | st.just([]))
    return row


@FUZZ
@given(st.lists(jsonl_row(), max_size=8), st.data())
def test_jsonl(rows, data):
    lines = [json.dumps(r, ensure_ascii=data.draw(st.booleans())) for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        check(write(tmp, "d.jsonl", data.draw(spoiled(lines))))


TAG = mostly(st.sampled_from(["O", "B-artist", "I-artist", "B-time"]), st.sampled_from(["B-", "b-x", "X", "I-"]))


@settings(FUZZ, max_examples=120)  # three files per split: the slowest to draw; 120 keeps the file under 20 s
@given(st.lists(st.sampled_from(["dev", "test"]), max_size=2, unique=True), st.booleans(), st.data())
def test_jointbert(splits, slots, data):
    with tempfile.TemporaryDirectory() as tmp:
        for split in ["train"] + splits:
            words = data.draw(st.lists(WORDS, min_size=data.draw(mostly(st.just(1), st.just(0))), max_size=6))
            write(tmp, f"{split}/seq.in", data.draw(spoiled([" ".join(w) for w in words])))
            if slots:
                extra = data.draw(mostly(st.just(0), st.just(1), odds=12))  # now and then a tag too many
                tags = [" ".join(data.draw(st.lists(TAG, min_size=len(w) + extra, max_size=len(w) + extra)))
                        for w in words]
                write(tmp, f"{split}/seq.out", data.draw(spoiled(tags)))
            n = max(0, len(words) + data.draw(mostly(st.just(0), st.sampled_from([-1, 1]), odds=12)))
            write(tmp, f"{split}/label", data.draw(spoiled(data.draw(st.lists(INTENT, min_size=n, max_size=n)))))
        check(Path(tmp))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["train", "val", "test", "oos_train", "x"]), inner, max_size=4),
                    max_leaves=12)
CLINC_ROWS = st.lists(mostly(st.tuples(TEXT, INTENT).map(list), JSON), max_size=6)
CLINC = st.fixed_dictionaries({"train": CLINC_ROWS}, optional={k: CLINC_ROWS for k in ("val", "test", "oos_test")})


@FUZZ
@given(mostly(CLINC, JSON, odds=3), st.data())
def test_clinc_json(obj, data):
    with tempfile.TemporaryDirectory() as tmp:
        check(write(tmp, "data_full.json", data.draw(spoiled([json.dumps(obj)]))).parent)
