"""What is wrong or risky in a dataset, read as a build reads it: `edgekit data check` and every build run this.

Each finding is a typed record (Finding: kind, severity, message, file, line, count, examples) that names where in
the data it is: the file and 1-based line its utterance was read from (Example.file and Example.line; CLINC150
JSON: the row's index in its list). KINDS says what each kind means and what its count counts; CHECKS finds them.
Utterances are compared as the base model's uncased tokenizer reads them (edgekit.text.wordpiece.basic_split: case,
accents, control characters and spacing dropped, punctuation split off), so "Play  Queen!" and "play queen !" are
one input to the model. No torch: piece counts come from the tokenizer the caller gives (Lengths).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from edgekit.data.dataset import SPLITS, Dataset, Example
from edgekit.text.wordpiece import basic_split


@dataclass(frozen=True)
class Kind:
    description: str
    counts: str  # what a finding's `count` counts


KINDS = {
    "duplicate": Kind("the same utterance more than once in one split", "copies in the split"),
    "near_duplicate": Kind("utterances of one split that differ only in case, accents, spacing or punctuation "
                           "spacing: one input to the model", "utterances"),
    "leakage": Kind("an utterance of dev or test that is also in train (as the model reads it): its score is not "
                    "a held-out score", "copies in dev or test"),
    "intent_conflict": Kind("the same utterance (as the model reads it) under different intents", "utterances"),
    "tag_conflict": Kind("the same utterance (as the model reads it) with different slot tags", "utterances"),
    "rare_intent": Kind("an intent with fewer training examples than min_intent_examples", "training examples"),
    "few_slot_values": Kind("a slot type with fewer distinct values in train than min_slot_values", "distinct values"),
    "similar_labels": Kind("intent or slot names that differ only in case, spaces or punctuation", "names"),
    "unseen_label": Kind("an intent or slot type seen only in dev or test: the model cannot learn it", "utterances"),
    "invalid_bio": Kind("an I-x tag after O or after another type (the readers accept it; scoring reads it as "
                        "conlleval does, as the start of a span)", "invalid tags"),
    "truncated": Kind("an utterance longer than the build's sequence length: its last pieces are never read",
                      "pieces past max_len"),
}


@dataclass(frozen=True)
class CheckConfig:
    """The thresholds of the checks, and how many examples (locations or values) a finding lists."""

    min_intent_examples: int = 10
    min_slot_values: int = 5
    shown: int = 3

    def __post_init__(self):
        for name in ("min_intent_examples", "min_slot_values", "shown"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")


@dataclass
class Finding:
    kind: str  # a key of KINDS
    message: str
    file: str | None  # where the utterance (or the first one of several) was read; None: made, not read
    line: int | None
    count: int  # what KINDS[kind].counts says
    examples: list[str] = field(default_factory=list)  # a few locations or values, as `message` names them
    severity: str = "warn"

    @property
    def where(self) -> str:
        """file:line (a CLINC150 JSON file: file row N, the row's index in its list)."""
        return _location(self.file, self.line)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "where": self.where}


@dataclass
class Lengths:
    """The build's sequence length and an utterance's piece count ([CLS] and [SEP] included)."""

    max_len: int
    count: Callable[[str], int]
    exact: bool = True  # False: whitespace words + 2, a lower bound of the pieces (the base model was not read)


def choose_max_len(tokenizer, texts: list[str], cap: int, bucket_percentiles: list[int] = ()) -> tuple[int, dict]:
    """p99 of piece counts ([CLS] and [SEP] included), rounded up to a multiple of 8, at most `cap`. Length
    buckets: the `bucket_percentiles` of piece counts rounded up the same way, those below max_len (SNIPS: p50
    12 -> 16, p90 19 -> 24 = max_len: buckets [16])."""
    lengths = np.array([tokenizer.length(t) for t in texts])
    p99 = float(np.percentile(lengths, 99))
    L = min(cap, max(8, int(math.ceil(p99 / 8)) * 8))
    buckets = {max(8, int(math.ceil(np.percentile(lengths, q) / 8)) * 8) for q in bucket_percentiles}
    return L, {"p50": float(np.percentile(lengths, 50)), "p99": p99, "max": int(lengths.max()),
               "truncated_share": float((lengths > L).mean()), "max_len": L,
               "buckets": sorted(b for b in buckets if b < L)}


@functools.lru_cache(maxsize=1 << 16)
def _word(word: str) -> str:
    return " ".join(basic_split(word))


def read_as_model(words: list[str]) -> tuple[str, ...]:
    """Each whitespace word as the uncased tokenizer reads it (its pieces' text, space-joined; "" for a word of
    control characters only): one tag per entry still lines up with the words."""
    return tuple(_word(w) for w in words)


def _location(file: str | None, line: int | None, shown: str | None = None) -> str:
    """file:line, or for a whole-file JSON (CLINC150) `file row N`: N is the row's index in its list."""
    if not file:
        return "(made from other utterances)"
    return f"{shown or file}{' row ' if file.endswith('.json') else ':'}{line}" if line else shown or file


def _label_key(name: str) -> str:
    return re.sub(r"[\W_]+", "", name.casefold())


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def spans(tags: list[str]) -> tuple[list[tuple[str, int, int]], list[int]]:
    """(type, start, end) spans as conlleval reads BIO (edgekit.scoring.metrics.chunks: an I-x after O or after
    another type opens a span), and the positions of those invalid I- tags."""
    out, bad, typ, start = [], [], None, 0
    for i, t in enumerate(list(tags) + ["O"]):
        prefix, ty = (t[0], t[2:]) if t != "O" else ("O", "")
        if prefix == "I" and ty != typ:
            bad.append(i)
        if typ is not None and (prefix in ("B", "O") or ty != typ):
            out.append((typ, start, i))
            typ = None
        if prefix in ("B", "I") and typ is None:
            typ, start = ty, i
    return out, bad


class _Read:
    """The dataset as the checks read it: every utterance's split, example and text as the model reads it."""

    def __init__(self, data: Dataset, cfg: CheckConfig, lengths: Lengths | None):
        self.data, self.cfg, self.lengths = data, cfg, lengths
        self.rows = [(s, ex, read_as_model(ex.words)) for s in SPLITS for ex in data.splits.get(s, [])]
        source = Path(data.source)
        self.root = source if source.is_dir() else source.parent

    def at(self, ex: Example) -> str:
        """A short location for a message: the file relative to the data, and its line (CLINC150: its row)."""
        path = Path(ex.file or "")
        return _location(ex.file, ex.line, path.relative_to(self.root).as_posix() if path.is_relative_to(self.root)
                         else None)

    def finding(self, kind: str, message: str, ex: Example, count: int, examples=()) -> Finding:
        return Finding(kind, message, ex.file, ex.line, count, list(examples)[: self.cfg.shown])


def _text(key: tuple[str, ...]) -> str:
    return " ".join(w for w in key if w)


def _duplicates(r: _Read) -> list[Finding]:
    out = []
    for split in SPLITS:
        seen: dict[tuple, list[Example]] = defaultdict(list)
        for ex in r.data.splits.get(split, []):
            seen[tuple(ex.words)].append(ex)
        for exs in (e for e in seen.values() if len(e) > 1):
            same = len({(ex.intent, tuple(ex.tags or ())) for ex in exs}) == 1
            out.append(r.finding("duplicate", f"{_clip(exs[0].text)} {len(exs)} times in {split}"
                                 f"{'' if same else ', labelled differently'}", exs[1], len(exs), map(r.at, exs)))
    return out


def _near_duplicates(r: _Read) -> list[Finding]:
    groups: dict[tuple, list[Example]] = defaultdict(list)
    for split, ex, key in r.rows:
        groups[split, _text(key)].append(ex)
    out = []
    for (split, _), exs in groups.items():
        variants = {ex.text: ex for ex in exs}
        if len(variants) > 1:
            second = list(variants.values())[1]
            out.append(r.finding("near_duplicate", f"{len(variants)} spellings of one utterance in {split}: "
                                 + ", ".join(_clip(t, 40) for t in list(variants)[:3]), second, len(exs),
                                 [f"{r.at(ex)} {_clip(t, 40)}" for t, ex in variants.items()]))
    return out


def _leakage(r: _Read) -> list[Finding]:
    train: dict[str, Example] = {}
    for split, ex, key in r.rows:
        if split == "train":
            train.setdefault(_text(key), ex)
    held: dict[tuple[str, str], list[Example]] = defaultdict(list)
    for split, ex, key in r.rows:
        if split != "train" and _text(key) in train:
            held[split, _text(key)].append(ex)
    out = []
    for (split, text), exs in held.items():
        first = train[text]
        how = "as written" if first.words == exs[0].words else "as the model reads it"
        out.append(r.finding("leakage", f"{_clip(exs[0].text)} in {split} is also in train ({r.at(first)}, {how})",
                             exs[0], len(exs), [r.at(ex) for ex in exs] + [r.at(first)]))
    return out


def _conflicts(r: _Read, kind: str, label, key) -> list[Finding]:
    """Utterances one `key` groups whose `label` differs: per label, how many and the first one's location."""
    groups: dict[tuple, list[Example]] = defaultdict(list)
    for _, ex, k in r.rows:
        if label(ex) is not None:
            groups[key(k)].append(ex)
    out = []
    for exs in groups.values():
        by = Counter(label(ex) for ex in exs)
        if len(by) < 2:
            continue
        firsts = {lab: next(ex for ex in exs if label(ex) == lab) for lab, _ in by.most_common()}
        if kind == "tag_conflict":  # the words whose tags differ, each with its tag: "york=I-city"
            diff = [i for i in range(len(exs[0].words)) if len({lab[i] for lab in by}) > 1][:3]
            shown = {lab: " ".join(f"{exs[0].words[i]}={lab[i]}" for i in diff) for lab in by}
        else:
            shown = {lab: lab for lab in by}
        parts = [f"{_clip(shown[lab], 50)} x{by[lab]} ({r.at(ex)})" for lab, ex in firsts.items()]
        out.append(r.finding(kind, f"{_clip(exs[0].text)}: " + "; ".join(parts[:3]), list(firsts.values())[1],
                             len(exs), parts))
    return out


def _intent_conflicts(r: _Read) -> list[Finding]:
    return _conflicts(r, "intent_conflict", lambda ex: ex.intent, _text)


def _tag_conflicts(r: _Read) -> list[Finding]:
    return _conflicts(r, "tag_conflict", lambda ex: tuple(ex.tags) if ex.tags is not None else None, lambda k: k)


def _rare_intents(r: _Read) -> list[Finding]:
    n, first = Counter(), {}
    for ex in r.data.splits["train"]:
        n[ex.intent] += 1
        first.setdefault(ex.intent, ex)
    least = r.cfg.min_intent_examples
    return [r.finding("rare_intent", f"intent {_clip(i)}: {n[i]} training example{'s' * (n[i] != 1)}, fewer than "
                      f"{least}", first[i], n[i], [r.at(first[i])]) for i in first if n[i] < least]


def _few_slot_values(r: _Read) -> list[Finding]:
    values: dict[str, set] = defaultdict(set)
    first: dict[str, Example] = {}
    for split, ex, key in r.rows:
        if split == "train" and ex.tags:
            for typ, s, e in spans(ex.tags)[0]:
                values[typ].add(_text(key[s:e]))
                first.setdefault(typ, ex)
    least = r.cfg.min_slot_values
    return [r.finding("few_slot_values", f"slot {_clip(t)}: {len(v)} distinct value{'s' * (len(v) != 1)} in train "
                      f"({', '.join(_clip(x, 30) for x in sorted(v)[:5])}), fewer than {least}", first[t], len(v),
                      sorted(v)) for t, v in values.items() if len(v) < least]


def _names(r: _Read) -> dict[str, dict[str, list[tuple[str, Example]]]]:
    """Intent and slot names, each with the splits and examples it is seen in (first one per split)."""
    seen: dict[str, dict[str, list]] = {"intent": defaultdict(list), "slot": defaultdict(list)}
    for split, ex, _ in r.rows:
        found = [("intent", ex.intent)] + [("slot", t[2:]) for t in ex.tags or () if t != "O"]
        for what, name in found:
            places = seen[what][name]
            if not places or places[-1][0] != split:
                places.append((split, ex))
    return seen


def _similar_labels(r: _Read) -> list[Finding]:
    out = []
    for what, names in _names(r).items():
        groups = defaultdict(list)
        for name in names:
            groups[_label_key(name)].append(name)
        for group in (g for g in groups.values() if len(g) > 1):
            out.append(r.finding("similar_labels", f"{what} names {', '.join(map(_clip, group))} differ only in "
                                 "case, spaces or punctuation", names[group[1]][0][1], len(group),
                                 [f"{n} ({r.at(names[n][0][1])})" for n in group]))
    return out


def _unseen_labels(r: _Read) -> list[Finding]:
    out = []
    for what, names in _names(r).items():
        for name, places in names.items():
            if places[0][0] != "train":
                held = Counter(split for split, ex, _ in r.rows
                               if (ex.intent == name if what == "intent" else
                                   any(t[2:] == name for t in ex.tags or () if t != "O")))
                n = sum(held.values())
                out.append(r.finding("unseen_label", f"{what} {_clip(name)} is in {' and '.join(held)} ({n} "
                                     f"utterance{'s' * (n != 1)}), never in train", places[0][1], n,
                                     [r.at(ex) for _, ex in places]))
    return out


def _invalid_bio(r: _Read) -> list[Finding]:
    out = []
    for _, ex, _ in r.rows:
        bad = spans(ex.tags)[1] if ex.tags else []
        if bad:
            i = bad[0]
            after = ex.tags[i - 1] if i else "the start"
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            out.append(r.finding("invalid_bio", f"{ex.tags[i]} after {after} at word {i + 1} {_clip(ex.words[i], 30)}"
                                 f"{more}", ex, len(bad), [r.at(ex)]))
    return out


def _truncated(r: _Read) -> list[Finding]:
    if r.lengths is None:
        return []
    L, out = r.lengths.max_len, []
    for split, ex, _ in r.rows:
        n = r.lengths.count(ex.text)
        if n > L:
            least = "" if r.lengths.exact else "at least "
            out.append(r.finding("truncated", f"{_clip(ex.text, 40)}: {least}{n} pieces in {split}, over max_len "
                                 f"{L}: the last {n - L} {'is' if n - L == 1 else 'are'} never read", ex, n - L,
                                 [r.at(ex)]))
    return out


CHECKS: dict[str, Callable[[_Read], list[Finding]]] = {
    "duplicate": _duplicates, "near_duplicate": _near_duplicates, "leakage": _leakage,
    "intent_conflict": _intent_conflicts, "tag_conflict": _tag_conflicts, "rare_intent": _rare_intents,
    "few_slot_values": _few_slot_values, "similar_labels": _similar_labels, "unseen_label": _unseen_labels,
    "invalid_bio": _invalid_bio, "truncated": _truncated,
}
assert CHECKS.keys() == KINDS.keys()


def check_dataset(data: Dataset, cfg: CheckConfig | None = None, lengths: Lengths | None = None) -> list[Finding]:
    """Every finding, kind by kind in KINDS' order. `lengths`: the build's sequence length and piece counts
    (None: utterances are not checked for truncation)."""
    r = _Read(data, cfg or CheckConfig(), lengths)
    return [f for kind in KINDS for f in CHECKS[kind](r)]


def summary(findings: list[Finding], shown: int = 3) -> dict:
    """What report.json keeps: the count of findings per kind (in KINDS' order) and the first `shown` of each."""
    counts = Counter(f.kind for f in findings)
    first = [f.to_dict() for kind in KINDS for f in [f for f in findings if f.kind == kind][:shown]]
    return {"total": len(findings), "counts": {k: counts[k] for k in KINDS if counts[k]}, "findings": first}
