"""Fuzzing the dataset readers: whatever the bytes, load_dataset returns a Dataset or raises an EdgekitError
(which the CLI prints as one line), never another exception.

Inputs are random bytes, and valid files of each format (mostly valid: the shapes users export) spoiled now and
then: a UTF-8 byte order mark, CRLF or CR line endings, latin-1 bytes inside UTF-8, a garbage line, an odd
value. And the readers' structure: lines read in chunks of any size against a lowered line limit, CSV headers
of any width, JSON nested to any depth. Each test writes into its own temporary folder (no function-scoped
fixture: hypothesis reuses one across examples) and keeps no example database.
"""

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.data import formats
from edgekit.data.dataset import Dataset, check_trainable, load_dataset
from edgekit.errors import DataError, EdgekitError

# Run in a child process by tests/data/test_readers_fuzzed.py, where a crash is a failed test, not the end of pytest.
pytestmark = pytest.mark.skipif(os.environ.get("EDGEKIT_FUZZ_CHILD") != "1",
                                reason="run in a child process (tests/data/test_readers_fuzzed.py)")
FUZZ = settings(max_examples=300, deadline=None, database=None, derandomize=True,  # the same inputs in every run
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


@settings(FUZZ, max_examples=300)  # three files per split: the slowest to draw
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


@contextmanager
def limits(line: int, chunk: int):
    """formats' line limit and read size set small, so that a drawn file crosses them (put back after)."""
    saved = formats.MAX_LINE_BYTES, formats._CHUNK
    formats.MAX_LINE_BYTES, formats._CHUNK = line, chunk
    try:
        yield
    finally:
        formats.MAX_LINE_BYTES, formats._CHUNK = saved


def too_long(data: bytes, limit: int) -> int | None:
    """The 1-based number of the first line over `limit` bytes (line break left out), as an editor counts lines."""
    lines = formats._BREAK.split(data.removeprefix(BOM))
    return next((i for i, ln in enumerate(lines, 1) if len(ln) > limit), None)


PIECE = st.sampled_from([b"a", b"bc", b"\xc3\xa9", b"\r", b"\n", b"\r\n", b" "])


@FUZZ
@given(st.lists(PIECE, max_size=60).map(b"".join), st.booleans(), st.integers(1, 12), st.integers(1, 9))
def test_lines_stream_in_as_the_whole_file_splits_them(data, bom, limit, chunk):
    """Read in chunks of 1 to 9 bytes (a \\r\\n cut in two), a file gives the lines its whole
    text splits into, breaks kept, or is refused at its first line over the limit, and only then."""
    with tempfile.TemporaryDirectory() as tmp, limits(limit, chunk):
        path = write(tmp, "d.txt", BOM + data if bom else data)
        try:
            got = [(n, raw) for n, raw in formats._raw_lines(path)]
        except DataError as e:
            assert e.line == too_long(data, limit) and "the most a line may hold" in str(e), (e, data)
            return
    assert too_long(data, limit) is None
    assert b"".join(raw for _, raw in got) == data and [n for n, _ in got] == list(range(1, len(got) + 1))
    assert all(len(formats._BREAK.findall(raw)) == 1 for _, raw in got[:-1])  # one break each, at its end


@FUZZ
@given(st.integers(0, 40), st.booleans(), st.integers(8, 200), st.integers(1, 64), st.data())
def test_csv_of_any_width_and_line_length(extra, dup, limit, chunk, data):
    """Headers of 2 to 43 columns (now and then one named twice), rows of any width, cells long and short, lines
    around the limit: a Dataset or one EdgekitError, and a file with a line over the limit never read."""
    header = ["text", "label"] + [f"c{i}" for i in range(extra)]
    header = data.draw(st.permutations(header))
    if dup:
        header.append(data.draw(st.sampled_from(header)))
    cell = st.sampled_from(["", "x", "play queen", "music", "a" * 30, '"q, r"', "b" * 90])
    rows = [",".join(data.draw(st.lists(cell, min_size=len(header) - 1, max_size=len(header) + 1)))
            for _ in range(data.draw(st.integers(0, 5)))]
    raw = "\n".join([",".join(header), *rows]).encode()
    with tempfile.TemporaryDirectory() as tmp, limits(limit, chunk):
        path = write(tmp, "d.csv", raw)
        if check(path) and too_long(raw, limit):
            raise AssertionError(f"a line over {limit} bytes was read")


def nested(depth: int, kind: str) -> str:
    return ("[" * depth + "1" + "]" * depth) if kind == "list" else ('{"a": ' * depth + "1" + "}" * depth)


@FUZZ
@given(st.integers(0, 3000), st.sampled_from(["list", "dict"]), st.sampled_from(["text", "slots", "row"]),
       st.integers(200, 8000))
def test_json_nested_to_any_depth(depth, kind, where, limit):
    """Nesting past Python's recursion limit, in a JSONL value, a JSONL row and a CLINC150 row: one EdgekitError
    (or a Dataset where the nesting is harmless), with lines held to a limit that cuts some of them."""
    deep = nested(depth, kind)
    row = deep if where == "row" else '{"text": %s, "intent": "a"}' % (deep if where == "text" else '"play it"')
    if where == "slots":
        row = '{"text": "play it", "intent": "a", "slots": %s}' % deep
    with tempfile.TemporaryDirectory() as tmp, limits(limit, 4096):
        check(write(tmp, "d.jsonl", ('{"text": "stop", "intent": "b"}\n' + row + "\n").encode()))
        check(write(tmp, "data_full.json", ('{"train": [["stop", "b"], %s]}' % deep).encode()).parent)
