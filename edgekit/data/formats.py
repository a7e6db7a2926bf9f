"""Dataset readers, one per format: JointBERT folders, CLINC150 JSON, CSV and JSONL (edgekit.data.dataset picks
one, and reads folders of split files with the CSV and JSONL readers).

Each reader returns {split: [Example]} with whitespace words, one BIO tag per word (or None for intent-only data)
and an intent, each example with where it was read (Example.file and .line). Bad input raises a DataError naming the
file and the 1-based line (or the JSON field). A UTF-8 byte order mark is accepted and dropped. Line files stream
in: a line over MAX_LINE_BYTES is refused as soon as that much of it has come in, and a whole-file JSON over
MAX_JSON_BYTES before it is read, so memory never holds more than one line beyond the examples read.
docs/data-formats.md is the user's view of these rules.
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import os
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import DataError
from edgekit.runtime.tokenizer import split_words

log = logging.getLogger("edgekit")

SPLITS = ("train", "dev", "test")
TEXT_COLUMNS = ("text", "utterance", "sentence", "query")
LABEL_COLUMNS = ("label", "intent", "category")
# Aliases accepted in a `split` column / key, and as the name of a split file (validation.csv).
SPLIT_ALIASES = {"train": "train", "dev": "dev", "val": "dev", "valid": "dev", "validation": "dev", "test": "test"}
# Line breaks as editors count them (str.splitlines also breaks at \x85 and \u2028, which JSON strings may hold), in
# bytes: \r and \n are never part of a multi-byte UTF-8 character.
_BREAK = re.compile(rb"\r\n|\r|\n")
MAX_LINE_BYTES = 1 << 20  # a line, or a CSV row (quoted line breaks join lines), may hold 1 MiB; checked as it streams
MAX_JSON_BYTES = 32 << 20  # a CLINC150 JSON file is read whole: at most 32 MiB (CLINC150's own: 2.5 MB)
_CHUNK = 1 << 16


@dataclass
class Example:
    words: list[str]
    intent: str
    tags: list[str] | None = None  # one BIO tag per word; None when the data has no slots
    # Where the example was read (None: made, not read). `line` is 1-based: JointBERT the line of seq.in, CSV the
    # row's first line, JSONL the line; CLINC150 JSON the row's 1-based index in its list (train, oos_train, val,
    # ...). Not part of equality, nor of any cache key: the same utterance read from elsewhere is the same data.
    file: str | None = field(default=None, compare=False, repr=False)
    line: int | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def _open(path: Path):
    if not path.is_file():
        raise DataError(path, None, "is a folder, expected a file" if path.is_dir() else "no such file")
    try:
        return path.open("rb")
    except OSError as e:
        raise DataError(path, None, f"cannot read ({e.strerror or e})") from None


def _decode(path: Path, raw: bytes, line: int) -> str:
    """UTF-8 text of `raw`, whose first line is `line`; a bad byte is refused naming its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line += len(_BREAK.findall(raw, 0, e.start))
        raise DataError(path, line, f"not valid UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8") from None


def _unmark(path: Path, head: bytes) -> bytes:
    """The file's first bytes without a UTF-8 byte order mark (Excel and Notepad write one); UTF-16 refused."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DataError(path, 1, "is UTF-16; save it as UTF-8")
    return head.removeprefix(codecs.BOM_UTF8)


def _too_long(path: Path, line: int, what: str = "line") -> DataError:
    over = "line longer than" if what == "line" else "a row over"
    return DataError(path, line, f"{over} {MAX_LINE_BYTES:,} bytes ({MAX_LINE_BYTES / 2**20:g} MiB), the most a {what} "
                                 "may hold")


def read_text(path: Path) -> str:
    """A file read whole (CLINC150 JSON): at most MAX_JSON_BYTES, UTF-8, a byte order mark dropped."""
    with _open(path) as f:  # refused by its size before it is read (and should it grow, by what was read)
        size = os.fstat(f.fileno()).st_size
        raw = f.read(MAX_JSON_BYTES + 1) if size <= MAX_JSON_BYTES else b""
    if max(size, len(raw)) > MAX_JSON_BYTES:
        raise DataError(path, None, f"{max(size, len(raw)):,} bytes; a CLINC150 JSON file is read whole "
                                    f"and may hold at most {MAX_JSON_BYTES:,} bytes ({MAX_JSON_BYTES / 2**20:g} MiB); "
                                    "give larger data as JSONL or CSV, which are read line by line")
    return _decode(path, _unmark(path, raw), 1)


def read_head(path: Path) -> tuple[str, bool]:
    """The text of a file's first MiB (enough for a first line, or to see that it is longer than a line) and
    whether that is the whole file."""
    with _open(path) as f:
        head = f.read(MAX_LINE_BYTES + 1)
    whole = len(head) <= MAX_LINE_BYTES  # judged on what was read: a byte order mark does not make a head whole
    raw = _unmark(path, head)
    return (_decode(path, raw, 1) if whole else raw.decode("utf-8", "ignore")), whole


def _raw_lines(path: Path):
    """(1-based line number, bytes with the line break) for each line, read in chunks: a line over MAX_LINE_BYTES
    is refused as soon as that much of it has come in, so no more of a file than one line is ever held."""
    with _open(path) as f:
        buf, n, more = _unmark(path, f.read(max(_CHUNK, 3))), 0, True  # the first read holds a whole BOM
        while more:
            chunk = f.read(_CHUNK)
            more = bool(chunk)
            lines = (buf + chunk).splitlines(keepends=True)  # bytes split at \r\n, \r and \n only
            buf = lines.pop() if more and lines and not lines[-1].endswith(b"\n") else b""  # \r: \r\n to come?
            for raw in lines:
                n += 1
                if len(raw) > MAX_LINE_BYTES and len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                    raise _too_long(path, n)
                yield n, raw
            if len(buf) - buf.endswith(b"\r") > MAX_LINE_BYTES:
                raise _too_long(path, n + 1)


def text_lines(path: Path):
    """(1-based line number, text without its line break) for each line; an empty file is refused."""
    n = 0
    for n, raw in _raw_lines(path):
        yield n, _decode(path, raw.rstrip(b"\r\n"), n)
    if not n:
        raise DataError(path, 1, "file is empty")


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(path, None, "missing split file")
    return [text for _, text in text_lines(path)]


class _CsvLines:
    """Decoded lines, line breaks kept, for csv.reader; a row (its quoted line breaks join lines) is held to
    MAX_LINE_BYTES: the reader calls `row_done` after each row."""

    def __init__(self, path: Path):
        self.path, self.lines, self.size, self.start, self.blank = path, _raw_lines(path), 0, 1, True

    def __iter__(self):
        return self

    def __next__(self) -> str:
        n, raw = next(self.lines)
        self.size += len(raw)
        if self.size > MAX_LINE_BYTES and self.size - len(raw) + len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            raise _too_long(self.path, self.start, "row")  # the breaks inside a row count, not the last
        if self.blank:
            self.blank = not raw.strip()
        return _decode(self.path, raw, n)

    def row_done(self, line: int) -> None:
        self.size, self.start = 0, line + 1


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _read_jointbert_split(folder: Path) -> list[Example]:
    seq_in, seq_out, label = folder / "seq.in", folder / "seq.out", folder / "label"
    words = _lines(seq_in)
    intents = _lines(label)
    tags = _lines(seq_out) if seq_out.exists() else None
    for p, other in ((label, intents), (seq_out, tags)):
        if other is not None and len(other) != len(words):
            raise DataError(p, min(len(other), len(words)) + 1,
                            f"{len(other)} lines, but {seq_in.name} has {len(words)}")
    out = []
    for i, line in enumerate(words):
        w = line.split()
        if not w:
            raise DataError(seq_in, i + 1, "empty utterance")
        t = None
        if tags is not None:
            t = tags[i].split()
            if len(t) != len(w):
                raise DataError(seq_out, i + 1, f"{len(t)} tags, but {seq_in.name} line {i + 1} has {len(w)} words")
            for tag in t:
                if tag != "O" and not (tag[:2] in ("B-", "I-") and len(tag) > 2):
                    raise DataError(seq_out, i + 1, f"{_clip(tag)!r} is not a BIO tag (O, B-x or I-x)")
        intent = intents[i].strip()
        if not intent:
            raise DataError(label, i + 1, "empty intent label")
        out.append(Example(w, intent, t, str(seq_in), i + 1))
    return out


def read_jointbert(path: Path, notes: list[str] | None = None) -> dict[str, list[Example]]:
    if not (path / "train").is_dir():
        raise DataError(path / "train", None, "missing split folder (a JointBERT layout needs train/)")
    return {s: _read_jointbert_split(path / s) for s in SPLITS if (path / s).is_dir()}


def _json(path: Path, text: str, line: int | None = None):
    try:
        value = json.loads(text)
        if "\\u" in text:  # only a \uXXXX escape can make a lone surrogate, which no tokenizer can take
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except UnicodeEncodeError as e:
        code = ord(e.object[e.start])
        raise DataError(path, line, f"a lone surrogate (\\u{code:04x}) is not valid Unicode text") from None
    except RecursionError:
        raise DataError(path, line, "invalid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or an integer too long to convert
        raise DataError(path, line or getattr(e, "lineno", None), f"invalid JSON ({getattr(e, 'msg', e)})") from None


def read_clinc(path: Path, notes: list[str] | None = None) -> dict[str, list[Example]]:
    file = path / "data_full.json" if path.is_dir() else path
    text = read_text(file)
    if not text.strip():
        raise DataError(file, 1, "file is empty")
    obj = _json(file, text)
    if not isinstance(obj, dict) or "train" not in obj:
        raise DataError(file, 1, "CLINC150 JSON needs a top-level object with a 'train' key")
    keys = {"train": ("train", "oos_train"), "dev": ("val", "oos_val"), "test": ("test", "oos_test")}
    out = {}
    for split, names in keys.items():
        exs = []
        for k in names:
            rows = obj.get(k, [])
            if not isinstance(rows, list):
                raise DataError(file, None, f"{k}: expected a list of [text, intent]")
            for j, row in enumerate(rows):
                if not (isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)
                        and row[1].strip()):
                    raise DataError(file, None, f"{k}[{j}]: expected [text, intent] (two strings, intent non-empty)")
                if row[0].split():
                    exs.append(Example(row[0].split(), row[1].strip(), None, str(file), j + 1))
        if exs:
            out[split] = exs
    return out


def _spans_to_bio(path: Path, line: int, text: str, spans, snapped: list) -> tuple[list[str], list[str]]:
    """Word tags from character spans. A span must start and end at word boundaries: one that cuts a word
    ("ueen" in "queen") is refused, since tagging the whole word would change the label. One that only leaves
    out punctuation stuck to the word ("queen" in "queen,") tags the whole word and is recorded in `snapped`."""
    if not isinstance(spans, list):
        raise DataError(path, line, "'slots' must be a list of {start, end, slot}")
    checked = []
    for sp in spans:
        if not isinstance(sp, dict) or not {"start", "end", "slot"} <= sp.keys():
            raise DataError(path, line, "each slot needs start, end and slot")
        s, e, name = sp["start"], sp["end"], sp["slot"]
        if not isinstance(name, str) or not name.strip():
            raise DataError(path, line, f"slot name {_clip(repr(name))}: must be a non-empty string")
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (s, e))
        if not (ints and 0 <= s < e <= len(text)):
            raise DataError(path, line, f"slot {_clip(name)!r} span [{_clip(repr(s))}, {_clip(repr(e))}) is outside "
                                        f"the text ({len(text)} chars)")
        checked.append((s, e, name))
    words = split_words(text)
    tags = ["O"] * len(words)
    starts, ends = [ws for _, ws, _ in words], [we for _, _, we in words]
    for s, e, name in sorted(checked):
        hit = range(bisect_right(ends, s), bisect_left(starts, e))  # the words it overlaps: log time, not a scan
        if not hit:
            raise DataError(path, line, f"slot {_clip(name)!r} span [{s}, {e}) covers no word")
        start, end = words[hit[0]][1], words[hit[-1]][2]
        inside = [(p, verb) for p, verb in ((s, "starts"), (e, "ends")) if start < p < end]
        for p, verb in inside:
            if text[p - 1].isalnum() and text[p].isalnum():
                word = next(w for w, ws, we in words if ws < p < we)
                raise DataError(path, line, f"slot {_clip(name)!r} span [{s}, {e}) {_clip(text[s:e])!r} {verb} inside "
                                            f"the word {_clip(word)!r}; a span must start and end at word boundaries, "
                                            f"e.g. [{start}, {end}) {_clip(text[start:end])!r}")
        if inside:
            snapped.append((line, text[s:e], text[start:end]))
        for k, i in enumerate(hit):
            if tags[i] != "O":
                raise DataError(path, line, f"slot {_clip(name)!r} overlaps another slot")
            tags[i] = ("B-" if k == 0 else "I-") + name
    return [w for w, _, _ in words], tags


def _assign(out: dict, value, path: Path, line: int, ex: Example, fixed: str | None = None) -> None:
    """Put `ex` into the split its `split` value names; in a split file (`fixed`) the value may only repeat it."""
    key = fixed or "train"
    if value is not None and value != "":
        named = SPLIT_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
        if named is None:
            raise DataError(path, line, f"unknown split {_clip(repr(value))} (use train, dev or test)")
        if fixed and named != fixed:
            raise DataError(path, line, f"split {value!r} in the {fixed} file; move the row to the {named} file")
        key = named
    out.setdefault(key, []).append(ex)


def read_jsonl(path: Path, notes: list[str] | None = None, split: str | None = None) -> dict[str, list[Example]]:
    """JSONL rows {"text", "intent" (or "label"), "slots": [{start, end, slot}], "split"}; `split` fixes the split."""
    out: dict[str, list[Example]] = {}
    any_slots = False
    snapped: list = []
    for i, line in text_lines(path):
        if not line.strip():
            continue
        row = _json(path, line, i)
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise DataError(path, i, "expected an object with a string 'text'")
        intent = row.get("intent", row.get("label"))
        if not isinstance(intent, str) or not intent.strip():
            raise DataError(path, i, "expected a non-empty string 'intent'")
        if not row["text"].split():
            raise DataError(path, i, "empty text")
        if "slots" in row:
            any_slots = True
            words, tags = _spans_to_bio(path, i, row["text"], row["slots"] or [], snapped)
        else:
            words, tags = row["text"].split(), None
        _assign(out, row.get("split"), path, i, Example(words, intent.strip(), tags, str(path), i), split)
    if not out:
        raise DataError(path, 1, "file holds no examples")
    if any_slots:  # rows without a "slots" key mean "no slots in this utterance"
        for exs in out.values():
            for ex in exs:
                ex.tags = ex.tags or ["O"] * len(ex.words)
    if snapped:  # not silent: the report's dataset notes and the log say so
        line, span, word = snapped[0]
        note = (f"{path.name}: {len(snapped)} slot span end(s) at punctuation inside a word (first: line {line}, "
                f"{_clip(span)!r} in {_clip(word)!r}); the whole word is tagged")
        log.warning("%s", note)
        if notes is not None:
            notes.append(note)
    return out


def read_csv(path: Path, notes: list[str] | None = None, split: str | None = None) -> dict[str, list[Example]]:
    """CSV (TSV for .tsv) with a header naming a text and a label column, optionally `split`; intent-only."""
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    # lines keep their line breaks (quoted fields hold them) and reader.line_num counts the file's lines
    source = _CsvLines(path)
    reader = csv.reader(source, dialect=dialect)
    out: dict[str, list[Example]] = {}
    try:
        for header in reader:
            source.row_done(reader.line_num)
            if any(c.strip() for c in header):
                break
        else:
            raise DataError(path, 1, "file is empty" if source.blank else "file holds no header")
        _read_csv_rows(path, reader, source, [h.strip().lower() for h in header], out, split)
    except csv.Error as e:  # NUL bytes, an unterminated quote, a field over csv.field_size_limit
        raise DataError(path, reader.line_num, f"bad CSV ({e})") from None
    return out


def _read_csv_rows(path: Path, reader, source: _CsvLines, header: list[str], out: dict, split: str | None) -> None:
    line = reader.line_num
    dups = sorted(h for h, n in Counter(header).items() if h and n > 1)
    if dups:
        raise DataError(path, line, f"duplicate column {', '.join(dups)} in the header; name each column once")
    for kind, names in (("text", TEXT_COLUMNS), ("label", LABEL_COLUMNS)):
        both = [c for c in names if c in header]
        if len(both) > 1:
            raise DataError(path, line, f"{len(both)} {kind} columns ({', '.join(both)}); keep one")
    tcol = next((header.index(c) for c in TEXT_COLUMNS if c in header), None)
    lcol = next((header.index(c) for c in LABEL_COLUMNS if c in header), None)
    if tcol is None or lcol is None:
        raise DataError(path, line, f"header needs a text column ({', '.join(TEXT_COLUMNS)}) and a label column "
                                    f"({', '.join(LABEL_COLUMNS)}); found {_clip(', '.join(header), 80)}")
    scol = header.index("split") if "split" in header else None
    first = line + 1
    for row in reader:
        line, start = reader.line_num, source.start  # the row's last line and its first (quoted breaks join lines)
        source.row_done(line)
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(path, line, f"{len(row)} fields, header has {len(header)}")
        words, label = row[tcol].split(), row[lcol].strip()
        if not words or not label:
            raise DataError(path, line, "empty text or label")
        _assign(out, row[scol] if scol is not None else None, path, line, Example(words, label, None, str(path), start),
                split)
    if not out:
        raise DataError(path, first, "file holds no examples")
