"""Datasets: parse JointBERT folders, CLINC150 JSON, CSV and JSONL into one word-level form.

Every example is a list of whitespace words, one BIO tag per word (or None for intent-only data),
and an intent. Errors name the file and the 1-based line.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import DataError, EdgekitError
from edgekit.runtime.tokenizer import split_words

SPLITS = ("train", "dev", "test")
FORMATS = ("jointbert", "clinc", "csv", "jsonl")
TEXT_COLUMNS = ("text", "utterance", "sentence", "query")
LABEL_COLUMNS = ("label", "intent", "category")
OOS_LABELS = ("oos", "out_of_scope")
# Aliases accepted in a `split` column / key.
SPLIT_ALIASES = {"train": "train", "dev": "dev", "val": "dev", "valid": "dev", "validation": "dev", "test": "test"}


@dataclass
class Example:
    words: list[str]
    intent: str
    tags: list[str] | None = None  # one BIO tag per word; None when the data has no slots

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass
class Dataset:
    """Parsed data. `intents` and `slot_tags` are the label sets learned from train (slot_tags[0] == "O")."""

    name: str
    format: str
    source: str
    splits: dict[str, list[Example]]
    intents: list[str]
    slot_tags: list[str]  # empty for intent-only data
    oos_label: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def has_slots(self) -> bool:
        return bool(self.slot_tags)

    def summary(self) -> dict:
        return {"name": self.name, "format": self.format, "source": self.source,
                "sizes": {k: len(v) for k, v in self.splits.items()}, "intents": len(self.intents),
                "slot_tags": len(self.slot_tags), "oos_label": self.oos_label, "notes": self.notes}


def detect_format(path: Path) -> str:
    """Guess the format of a file or folder; raise a DataError naming it when nothing fits."""
    if path.is_dir():
        if (path / "data_full.json").is_file():
            return "clinc"
        if any((path / s).is_dir() for s in ("train", "dev", "test")):
            return "jointbert"
        raise DataError(path, None, "folder is neither a JointBERT layout (train/seq.in, ...) nor holds data_full.json")
    if not path.is_file():
        raise DataError(path, None, "no such file or folder")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    head = _read_text(path).lstrip()
    if not head:
        raise DataError(path, 1, "file is empty")
    if head.startswith("{"):
        first = head.splitlines()[0].strip()
        try:
            obj = json.loads(first)
            return "jsonl" if isinstance(obj, dict) and "text" in obj else "clinc"
        except json.JSONDecodeError:
            return "clinc"
    first = head.splitlines()[0].lower()
    if any(c in first for c in TEXT_COLUMNS) and any(c in first for c in LABEL_COLUMNS):
        return "csv"
    raise DataError(path, 1, "unknown format: expected a JointBERT folder, CLINC150 JSON, CSV with a header "
                             "(text,label) or JSONL ({\"text\", \"intent\"})")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(path, line, "not valid UTF-8") from None


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(path, None, "missing split file")
    lines = _read_text(path).splitlines()
    if not lines:
        raise DataError(path, 1, "file is empty")
    return lines


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
                    raise DataError(seq_out, i + 1, f"{tag!r} is not a BIO tag (O, B-x or I-x)")
        intent = intents[i].strip()
        if not intent:
            raise DataError(label, i + 1, "empty intent label")
        out.append(Example(w, intent, t))
    return out


def read_jointbert(path: Path) -> dict[str, list[Example]]:
    if not (path / "train").is_dir():
        raise DataError(path / "train", None, "missing split folder (a JointBERT layout needs train/)")
    return {s: _read_jointbert_split(path / s) for s in SPLITS if (path / s).is_dir()}


def read_clinc(path: Path) -> dict[str, list[Example]]:
    file = path / "data_full.json" if path.is_dir() else path
    text = _read_text(file)
    if not text.strip():
        raise DataError(file, 1, "file is empty")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(file, e.lineno, f"invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict) or "train" not in obj:
        raise DataError(file, 1, "CLINC150 JSON needs a top-level object with a 'train' key")
    keys = {"train": ("train", "oos_train"), "dev": ("val", "oos_val"), "test": ("test", "oos_test")}
    out = {}
    for split, (k, oos_k) in keys.items():
        rows = obj.get(k, []) + obj.get(oos_k, [])
        if not rows:
            continue
        exs = []
        for j, row in enumerate(rows):
            if not (isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)):
                raise DataError(file, None, f"{k}[{j}]: expected [text, intent]")
            words = row[0].split()
            if words:
                exs.append(Example(words, row[1]))
        out[split] = exs
    return out


def _spans_to_bio(path: Path, line: int, text: str, spans: list) -> tuple[list[str], list[str]]:
    words = split_words(text)
    tags = ["O"] * len(words)
    for sp in sorted(spans, key=lambda s: s.get("start", 0) if isinstance(s, dict) else 0):
        if not isinstance(sp, dict) or not {"start", "end", "slot"} <= sp.keys():
            raise DataError(path, line, "each slot needs start, end and slot")
        s, e, name = sp["start"], sp["end"], sp["slot"]
        if not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(text)):
            raise DataError(path, line, f"slot {name!r} span [{s}, {e}) is outside the text ({len(text)} chars)")
        hit = [i for i, (_, ws, we) in enumerate(words) if ws < e and s < we]
        if not hit:
            raise DataError(path, line, f"slot {name!r} span [{s}, {e}) covers no word")
        for k, i in enumerate(hit):
            if tags[i] != "O":
                raise DataError(path, line, f"slot {name!r} overlaps another slot")
            tags[i] = ("B-" if k == 0 else "I-") + name
    return [w for w, _, _ in words], tags


def _assign(out: dict, split: str | None, path: Path, line: int, ex: Example):
    key = "train"
    if split:
        key = SPLIT_ALIASES.get(split.strip().lower())
        if key is None:
            raise DataError(path, line, f"unknown split {split!r} (use train, dev or test)")
    out.setdefault(key, []).append(ex)


def read_jsonl(path: Path) -> dict[str, list[Example]]:
    lines = _lines(path)
    out: dict[str, list[Example]] = {}
    any_slots = False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, i, f"invalid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise DataError(path, i, "expected an object with a string 'text'")
        intent = row.get("intent", row.get("label"))
        if not isinstance(intent, str) or not intent:
            raise DataError(path, i, "expected a non-empty string 'intent'")
        if not row["text"].split():
            raise DataError(path, i, "empty text")
        if "slots" in row:
            any_slots = True
            words, tags = _spans_to_bio(path, i, row["text"], row["slots"] or [])
        else:
            words, tags = row["text"].split(), None
        _assign(out, row.get("split"), path, i, Example(words, intent, tags))
    if not out:
        raise DataError(path, 1, "file holds no examples")
    if any_slots:  # rows without a "slots" key mean "no slots in this utterance"
        for exs in out.values():
            for ex in exs:
                ex.tags = ex.tags or ["O"] * len(ex.words)
    return out


def read_csv(path: Path) -> dict[str, list[Example]]:
    text = _read_text(path)
    if not text.strip():
        raise DataError(path, 1, "file is empty")
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    reader = csv.reader(text.splitlines(), dialect=dialect)
    header = [h.strip().lower() for h in next(reader)]
    tcol = next((header.index(c) for c in TEXT_COLUMNS if c in header), None)
    lcol = next((header.index(c) for c in LABEL_COLUMNS if c in header), None)
    if tcol is None or lcol is None:
        raise DataError(path, 1, f"header needs a text column ({', '.join(TEXT_COLUMNS)}) and a label column "
                                 f"({', '.join(LABEL_COLUMNS)}); found {', '.join(header)}")
    scol = header.index("split") if "split" in header else None
    out: dict[str, list[Example]] = {}
    for row in reader:
        line = reader.line_num
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise DataError(path, line, f"{len(row)} fields, header has {len(header)}")
        words, label = row[tcol].split(), row[lcol].strip()
        if not words or not label:
            raise DataError(path, line, "empty text or label")
        _assign(out, row[scol] if scol is not None else None, path, line, Example(words, label))
    if not out:
        raise DataError(path, 2, "file holds no examples")
    return out


READERS = {"jointbert": read_jointbert, "clinc": read_clinc, "csv": read_csv, "jsonl": read_jsonl}


def _stable_key(ex: Example, seed: int) -> str:
    return hashlib.sha1(f"{seed}\0{ex.text}\0{ex.intent}".encode()).hexdigest()


def stratified_split(examples: list[Example], fraction: float, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Deterministically move `fraction` of each intent's examples out (at least one where an intent has 3+)."""
    by_intent: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        by_intent[ex.intent].append(ex)
    keep, held = [], []
    for intent in sorted(by_intent):
        exs = sorted(by_intent[intent], key=lambda e: _stable_key(e, seed))
        n = round(len(exs) * fraction) if len(exs) >= 3 else 0
        n = max(n, 1) if len(exs) >= 3 else 0
        held += exs[:n]
        keep += exs[n:]
    return keep, held


def load_dataset(path: str | Path, fmt: str | None = None, seed: int = 0) -> Dataset:
    """Read a dataset, auto-detecting its format unless `fmt` is given; fill in missing dev/test splits."""
    path = Path(path)
    if not path.exists():
        raise DataError(path, None, "no such file or folder")
    if fmt is None:
        fmt = detect_format(path)
    elif fmt not in READERS:
        raise EdgekitError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    splits = READERS[fmt](path)
    if "train" not in splits or not splits["train"]:
        raise DataError(path, None, "no training examples")
    notes = []
    if "test" not in splits:
        splits["train"], splits["test"] = stratified_split(splits["train"], 0.1, seed)
        notes.append(f"test: a deterministic stratified 10% of train (seed {seed})")
    if "dev" not in splits:
        splits["train"], splits["dev"] = stratified_split(splits["train"], 0.1 / 0.9 if notes else 0.1, seed + 1)
        notes.append(f"dev: a deterministic stratified share of train (seed {seed + 1})")
    has_slots = splits["train"][0].tags is not None
    intents = sorted({ex.intent for ex in splits["train"]})
    oos = next((lab for lab in OOS_LABELS if lab in intents), None)
    tags: list[str] = []
    if has_slots:
        names = sorted({t[2:] for ex in splits["train"] for t in ex.tags if t != "O"})
        tags = ["O"] + [f"{p}-{n}" for n in names for p in ("B", "I")]
    name = path.name if path.is_dir() else path.stem
    return Dataset(name, fmt, str(path), {s: splits[s] for s in SPLITS}, intents, tags, oos, notes)


def _mentions(tags: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, slot) of each BIO chunk; an I- without its B- starts a chunk, as conlleval reads it."""
    out, start, slot = [], None, None
    for i, t in enumerate(tags + ["O"]):
        if t.startswith("I-") and slot == t[2:]:
            continue
        if slot is not None:
            out.append((start, i, slot))
            start, slot = None, None
        if t != "O":
            start, slot = i, t[2:]
    return out


def open_slots(examples: list[Example], min_values: int = 30, min_ratio: float = 0.3) -> set[str]:
    """Open-class slots (names, titles, places): many distinct values for their occurrences, mostly words (slots
    whose values often hold digits, such as dates and times, are not names)."""
    seen, count = defaultdict(set), defaultdict(int)
    for ex in examples:
        for s, e, slot in _mentions(ex.tags or []):
            seen[slot].add(tuple(ex.words[s:e]))
            count[slot] += 1

    def wordy(values) -> bool:
        return sum(any(c.isdigit() for w in v for c in w) for v in values) <= 0.1 * len(values)

    return {k for k, v in seen.items() if len(v) >= min_values and len(v) / count[k] >= min_ratio and wordy(v)}


def swap_mentions(examples: list[Example], n: int, seed: int = 0, novel_words: list[str] | None = None,
                  novel_share: float = 0.0) -> list[Example]:
    """`n` new examples: copies of random slot-bearing examples whose every slot value is replaced by another value
    of the same slot seen in `examples`, drawn uniformly over the distinct values.

    Drawing over distinct values, not occurrences, shows the model rare values (the ones a vocabulary budget
    splits into small pieces) as often as common ones, in many contexts: it has to read the context, not
    memorise names. With `novel_words`, a `novel_share` of the open-class values (see `open_slots`) is made of
    those words instead (as many as the drawn value has): names the data never had, as at test time."""
    import random

    rng = random.Random(seed)
    values: dict[str, set] = defaultdict(set)
    for ex in examples:
        for s, e, slot in _mentions(ex.tags or []):
            values[slot].add(tuple(ex.words[s:e]))
    pool = {slot: sorted(v) for slot, v in values.items()}
    opened = open_slots(examples) if novel_words else set()
    sources = [ex for ex in examples if ex.tags and any(t != "O" for t in ex.tags)]
    out = []
    for _ in range(n if sources else 0):
        ex = rng.choice(sources)
        words, tags, last = [], [], 0
        for s, e, slot in _mentions(ex.tags):
            value = list(rng.choice(pool[slot]))
            if slot in opened and rng.random() < novel_share:
                value = [rng.choice(novel_words) for _ in value]
            words += ex.words[last:s] + value
            tags += ex.tags[last:s] + [f"B-{slot}"] + [f"I-{slot}"] * (len(value) - 1)
            last = e
        out.append(Example(words + ex.words[last:], ex.intent, tags + ex.tags[last:]))
    return out


def replace_words(examples: list[Example], n: int, seed: int = 0, share: float = 0.15) -> list[Example]:
    """`n` new intent-only examples: copies of random examples with each word, at rate `share`, replaced by a
    word drawn uniformly from the distinct words of `examples` (as TinyBERT augments: the teacher labels the
    perturbed utterances, so the student sees its answers off the training points, not only on them)."""
    import random

    rng = random.Random(seed)
    vocab = sorted({w for ex in examples for w in ex.words})
    out = []
    for _ in range(n if vocab else 0):
        ex = rng.choice(examples)
        out.append(Example([rng.choice(vocab) if rng.random() < share else w for w in ex.words], ex.intent, None))
    return out
