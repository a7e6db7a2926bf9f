"""Dataset readers: JointBERT folders, CLINC150 JSON, CSV, JSONL and folders of split files (train.csv, ...).

Each reader returns {split: [Example]} with whitespace words, one BIO tag per word (or None for intent-only data)
and an intent. Bad input raises a DataError naming the file and the 1-based line (or the JSON field). A UTF-8
byte order mark is accepted and dropped. docs/data-formats.md is the user's view of these rules.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import DataError
from edgekit.runtime.tokenizer import split_words

log = logging.getLogger("edgekit")

SPLITS = ("train", "dev", "test")
FORMATS = ("jointbert", "clinc", "csv", "jsonl", "split-files")
TEXT_COLUMNS = ("text", "utterance", "sentence", "query")
LABEL_COLUMNS = ("label", "intent", "category")
# Aliases accepted in a `split` column / key, and as the name of a split file (validation.csv).
SPLIT_ALIASES = {"train": "train", "dev": "dev", "val": "dev", "valid": "dev", "validation": "dev", "test": "test"}
SPLIT_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# Line breaks as editors count them; str.splitlines also breaks at \x85 and \u2028, which JSON strings may hold.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass
class Example:
    words: list[str]
    intent: str
    tags: list[str] | None = None  # one BIO tag per word; None when the data has no slots

    @property
    def text(self) -> str:
        return " ".join(self.words)


def read_text(path: Path) -> str:
    """The file as text: UTF-8, a leading byte order mark dropped (Excel and Notepad write one)."""
    if not path.is_file():
        raise DataError(path, None, "is a folder, expected a file" if path.is_dir() else "no such file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(path, None, f"cannot read ({e.strerror or e})") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DataError(path, 1, "is UTF-16; save it as UTF-8")
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = len(_LINE_BREAK.split(raw[: e.start].decode("utf-8")))  # the bytes before the bad one are UTF-8
        raise DataError(path, line, f"not valid UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8") from None


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(path, None, "missing split file")
    lines = _LINE_BREAK.split(read_text(path))
    if lines[-1] == "":  # the break that ends the last line
        lines.pop()
    if not lines:
        raise DataError(path, 1, "file is empty")
    return lines


def _clip(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def split_files(folder: Path) -> dict[str, Path]:
    """The split files of a folder ({"train": folder/"train.csv", "dev": folder/"validation.jsonl", ...})."""
    found: dict[str, list[Path]] = {}
    for f in sorted(folder.iterdir()):
        split = SPLIT_ALIASES.get(f.stem.lower())
        if split and f.suffix.lower() in SPLIT_SUFFIXES and f.is_file():
            found.setdefault(split, []).append(f)
    for split, fs in found.items():
        if len(fs) > 1:
            raise DataError(folder, None, f"{len(fs)} files for the {split} split ({', '.join(f.name for f in fs)}); "
                                          "keep one")
    return {s: fs[0] for s, fs in found.items()}


def detect_format(path: Path) -> str:
    """Guess the format of a file or folder; raise a DataError naming it when nothing fits."""
    if path.is_dir():
        if (path / "data_full.json").is_file():
            return "clinc"
        if any((path / s).is_dir() for s in SPLITS):
            return "jointbert"
        if split_files(path):
            return "split-files"
        raise DataError(path, None, "folder is neither a JointBERT layout (train/seq.in, ...), a folder of split files "
                                    "(train.csv, test.csv or .jsonl), nor holds data_full.json")
    if not path.is_file():
        raise DataError(path, None, "no such file or folder")
    suffix = path.suffix.lower()
    if suffix in SPLIT_SUFFIXES:
        return SPLIT_SUFFIXES[suffix]
    head = read_text(path).lstrip()
    if not head:
        raise DataError(path, 1, "file is empty")
    first = _LINE_BREAK.split(head, maxsplit=1)[0]
    if head.startswith("{"):
        try:
            obj = json.loads(first)
            return "jsonl" if isinstance(obj, dict) and "text" in obj else "clinc"
        except (ValueError, RecursionError):
            return "clinc"
    if any(c in first.lower() for c in TEXT_COLUMNS) and any(c in first.lower() for c in LABEL_COLUMNS):
        return "csv"
    raise DataError(path, 1, "unknown format: expected a JointBERT folder, CLINC150 JSON, CSV with a header "
                             "(text,label) or JSONL ({\"text\", \"intent\"})")


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
        out.append(Example(w, intent, t))
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
                    exs.append(Example(row[0].split(), row[1].strip()))
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
    for s, e, name in sorted(checked):
        hit = [i for i, (_, ws, we) in enumerate(words) if ws < e and s < we]
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
    for i, line in enumerate(_lines(path), 1):
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
        _assign(out, row.get("split"), path, i, Example(words, intent.strip(), tags), split)
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
    text = read_text(path)
    if not text.strip():
        raise DataError(path, 1, "file is empty")
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    # newline="": quoted fields keep their line breaks and reader.line_num counts the file's lines
    reader = csv.reader(io.StringIO(text, newline=""), dialect=dialect)
    out: dict[str, list[Example]] = {}
    try:
        header = next((r for r in reader if any(c.strip() for c in r)), None)
        if header is None:
            raise DataError(path, 1, "file holds no header")
        _read_csv_rows(path, reader, [h.strip().lower() for h in header], out, split)
    except csv.Error as e:  # NUL bytes, an unterminated quote, a field over csv.field_size_limit
        raise DataError(path, reader.line_num, f"bad CSV ({e})") from None
    return out


def _read_csv_rows(path: Path, reader, header: list[str], out: dict, split: str | None) -> None:
    line = reader.line_num
    dups = sorted({h for h in header if h and header.count(h) > 1})
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
        line = reader.line_num
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(path, line, f"{len(row)} fields, header has {len(header)}")
        words, label = row[tcol].split(), row[lcol].strip()
        if not words or not label:
            raise DataError(path, line, "empty text or label")
        _assign(out, row[scol] if scol is not None else None, path, line, Example(words, label), split)
    if not out:
        raise DataError(path, first, "file holds no examples")


def read_split_files(path: Path, notes: list[str] | None = None) -> dict[str, list[Example]]:
    """A folder of one file per split: train, dev (or validation, val), test; each .csv/.tsv or .jsonl/.ndjson."""
    if not path.is_dir():
        raise DataError(path, None, "the split-files format reads a folder (train.csv, test.csv, ...), not a file")
    files = split_files(path)
    if "train" not in files:
        found = ", ".join(f.name for f in files.values()) or "no split files"
        raise DataError(path, None, f"no train file (train.csv or train.jsonl); found {found}")
    return {s: READERS[SPLIT_SUFFIXES[f.suffix.lower()]](f, notes, split=s)[s] for s, f in files.items()}


READERS = {"jointbert": read_jointbert, "clinc": read_clinc, "csv": read_csv, "jsonl": read_jsonl,
           "split-files": read_split_files}
