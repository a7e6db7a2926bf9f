"""Datasets: JointBERT folders, CLINC150 JSON, CSV, JSONL and folders of split files in one word-level form.

Every example is a list of whitespace words, one BIO tag per word (or None for intent-only data),
and an intent. Here: which layout a path holds (detect_format), folders of split files, the splits drawn from
train; the reader of each format is in edgekit.data.formats. Errors name the file and the 1-based line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.data.formats import (
    LABEL_COLUMNS,
    SPLIT_ALIASES,
    SPLITS,
    TEXT_COLUMNS,
    Example,
    read_clinc,
    read_csv,
    read_head,
    read_jointbert,
    read_jsonl,
    text_lines,
)
from edgekit.errors import DataError, EdgekitError

log = logging.getLogger("edgekit")
# Re-exported: callers read datasets through this module.
__all__ = ["FORMATS", "SPLITS", "Dataset", "Example", "build_seed", "check_trainable", "detect_format", "load_dataset",
           "package_split", "read_splits", "read_utterances", "stratified_split", "unlabelled_pool"]
OOS_LABELS = ("oos", "out_of_scope")
FORMATS = ("jointbert", "clinc", "csv", "jsonl", "split-files")
SPLIT_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # as editors count lines (not str.splitlines: JSON strings may hold \u2028)


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
    split_from_train: list[str] = field(default_factory=list)  # the splits the data did not give

    @property
    def has_slots(self) -> bool:
        return bool(self.slot_tags)

    def summary(self) -> dict:
        return {"name": self.name, "format": self.format, "source": self.source,
                "sizes": {k: len(v) for k, v in self.splits.items()}, "intents": len(self.intents),
                "slot_tags": len(self.slot_tags), "oos_label": self.oos_label, "notes": self.notes}


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
    head, whole = read_head(path)
    head = head.lstrip()
    if not head:
        raise DataError(path, 1, "file is empty")
    lines = _LINE_BREAK.split(head, maxsplit=1)
    first = lines[0]
    if head.startswith("{"):
        if len(lines) == 1 and not whole:  # a first line over a MiB: a whole-file JSON (CLINC150 on one line)
            return "clinc"
        try:
            obj = json.loads(first)
            return "jsonl" if isinstance(obj, dict) and "text" in obj else "clinc"
        except (ValueError, RecursionError):
            return "clinc"
    if any(c in first.lower() for c in TEXT_COLUMNS) and any(c in first.lower() for c in LABEL_COLUMNS):
        return "csv"
    raise DataError(path, 1, "unknown format: expected a JointBERT folder, CLINC150 JSON, CSV with a header "
                             "(text,label) or JSONL ({\"text\", \"intent\"})")


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


def read_splits(path: Path, fmt: str | None = None, notes: list[str] | None = None) -> tuple[str, dict]:
    """The splits a dataset gives, as read (none drawn): (format, {split: [Example]})."""
    if not path.exists():
        raise DataError(path, None, "no such file or folder")
    if fmt is None:
        fmt = detect_format(path)
    elif fmt not in READERS:
        raise EdgekitError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return fmt, READERS[fmt](path, [] if notes is None else notes)


def load_dataset(path: str | Path, fmt: str | None = None, seed: int | None = 0) -> Dataset:
    """Read a dataset, auto-detecting its format unless `fmt` is given; fill in missing dev/test splits, drawn
    with `seed` (None: a package's seed that could not be read; 0, with a warning when a split is drawn)."""
    path = Path(path)
    notes: list[str] = []
    fmt, splits = read_splits(path, fmt, notes)
    if "train" not in splits or not splits["train"]:
        raise DataError(path, None, "no training examples")
    made = [s for s in ("test", "dev") if s not in splits]
    if seed is None:
        if made:
            log.warning("%s has no %s split and the package no report.json naming its build's seed: drawn with "
                        "seed 0, which holds out other utterances than the build did if it ran with another --seed",
                        path, " or ".join(made))
        seed = 0
    if "test" in made:
        splits["train"], splits["test"] = stratified_split(splits["train"], 0.1, seed)
        notes.append(f"test: a deterministic stratified 10% of train (seed {seed})")
    if "dev" in made:
        share = 0.1 / 0.9 if "test" in made else 0.1  # 10% of the data as given
        splits["train"], splits["dev"] = stratified_split(splits["train"], share, seed + 1)
        notes.append(f"dev: a deterministic stratified share of train (seed {seed + 1})")
    has_slots = splits["train"][0].tags is not None
    for s in ("dev", "test"):  # e.g. a JointBERT test/ without seq.out: not an error, but not silent either
        if has_slots and splits[s] and splits[s][0].tags is None:
            notes.append(f"{s}: no slot tags (train has them); scored on intents only")
    intents = sorted({ex.intent for ex in splits["train"]})
    oos = next((lab for lab in OOS_LABELS if lab in intents), None)
    tags: list[str] = []
    if has_slots:
        names = sorted({t[2:] for ex in splits["train"] for t in ex.tags if t != "O"})
        tags = ["O"] + [f"{p}-{n}" for n in names for p in ("B", "I")]
    name = path.name if path.is_dir() else path.stem
    return Dataset(name, fmt, str(path), {s: splits[s] for s in SPLITS}, intents, tags, oos, notes, made)


def build_seed(package: str | Path) -> int | None:
    """The seed a package's build drew the dev and test splits it made with (its report.json; None without a
    readable one), so that scoring the package on data without those splits holds out what the build did."""
    from edgekit.runtime.jsonfile import REPORT_BYTES, read_json

    report = Path(package) / "report.json"
    try:  # the runtime's bounded reader: a report of 100k `[` is no seed, not a RecursionError
        return int(read_json(report, REPORT_BYTES, "report").get("config", {}).get("seed") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def package_split(data: str | Path, package: str | Path, split: str = "test", fmt: str | None = None) -> list[Example]:
    """The utterances of `split` that score or time a package (eval, bench, profile): splits the data lacks are
    drawn as the package's build drew them (build_seed). split "all": every utterance the data holds, none drawn
    (a held-out file of your own). An unknown split or an empty one is refused in one line."""
    if split == "all":
        examples = [ex for part in read_splits(Path(data), fmt)[1].values() for ex in part]
        if not examples:
            raise DataError(data, None, "no utterances")
        return examples
    if split not in SPLITS:
        raise EdgekitError(f"unknown --split {split!r}; choose {', '.join(SPLITS)} or all")
    ds = load_dataset(data, fmt, build_seed(package))
    if not ds.splits[split]:
        why = " (drawn from train: no intent has the 3 or more utterances it takes)" if split in ds.split_from_train \
            else ""
        raise DataError(data, None, f"the {split} split is empty{why}; score another with --split")
    return ds.splits[split]


def check_trainable(data: Dataset) -> None:
    """Refuse, before any training, data a build cannot train on or score, in one line saying what to add.

    A build needs 2 intents in train and a non-empty dev (model selection) and test (the report). A split made
    from train takes examples only from intents with 3 or more (stratified_split keeps rarer intents whole in
    train, to be learned though not scored); dev made after test needs 4 of one intent. An intent seen once is
    accepted: real data has them (ATIS)."""
    problems = []
    if len(data.intents) < 2:
        have = f" ({data.intents[0]!r})" if data.intents else ""
        problems.append(f"{len(data.intents)} intent in train{have}, a classifier needs at least 2")
    empty = [s for s in ("dev", "test") if not data.splits[s]]
    problems += [f"{s} is empty" for s in empty if s not in data.split_from_train]
    made = [s for s in empty if s in data.split_from_train]
    if made:
        need = 4 if "dev" in made and "test" in data.split_from_train else 3
        problems.append(f"{' and '.join(made)} would be empty: a split made from train takes examples only from "
                        f"intents with enough of them; give one intent at least {need} examples, or give "
                        f"{' and '.join(made)} split{'s' if len(made) > 1 else ''}")
    if problems:
        raise DataError(data.source, None, "cannot train and score on this data: " + "; ".join(problems))


def read_utterances(path: Path, limit: int | None = None) -> list[Example]:
    """Unlabelled utterances, one a line (blank lines skipped), as Examples without an intent or tags: text for a
    teacher to label (distill.unlabelled). At most `limit` of them, the first ones."""
    out = []
    for n, text in text_lines(Path(path)):
        words = text.split()
        if words:
            out.append(Example(words, None, None, str(path), n))
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise DataError(Path(path), None, "holds no utterance (one a line)")
    return out


def unlabelled_pool(path: Path, limit: int, data: Dataset) -> tuple[list[Example], int]:
    """distill.unlabelled's utterances (at most `limit`), less those equal to a dev or test utterance (case and
    spacing aside): the teacher's answers on the splits that score the build must not be trained on. Returns them
    and how many were dropped."""
    held_out = {" ".join(ex.words).lower() for s in ("dev", "test") for ex in data.splits.get(s, [])}
    got = read_utterances(path, limit)
    kept = [ex for ex in got if " ".join(ex.words).lower() not in held_out]
    return kept, len(got) - len(kept)
