"""The one way a package's JSON files (manifest.json, labels.json, the runtime's schemas) are read: bounded in
bytes before they are read, bounded in nesting before they are parsed, and strict where Python's json is lenient.

- size: a file over its limit is refused from its size alone, before a byte of it is read;
- nesting: arrays and objects deeper than MAX_DEPTH are refused by a linear scan (no recursion), before
  json.loads, whose C parser recurses once per level (100k `[` was a RecursionError);
- a key twice in one object is refused (Python keeps the last, other parsers the first: two readings of one file);
- NaN, Infinity, -Infinity and numbers that overflow to infinity (`1e400`) are refused: no other JSON parser reads
  them, and a schema's minimum/maximum cannot catch NaN. Integers longer than Python's 4300 digits are refused.

Each failure is a JSONFileError (a ValueError) whose message is one line that starts with the file's path.
"""

from __future__ import annotations

import json
import math
import os
import re
from itertools import accumulate
from pathlib import Path

MANIFEST_BYTES = 1 << 20  # 1 MiB: a real manifest is 2-3 KB
LABELS_BYTES = 4 << 20  # 4 MiB: 10,000 intents of 40 characters are 0.5 MB
REPORT_BYTES = 64 << 20  # 64 MiB: a build's report.json beside a package is tens of KB
MAX_DEPTH = 32  # arrays and objects inside one another: a manifest needs 4, labels.json 2

# A JSON string, escapes included. The closing quote is optional so that an unterminated string ends the scan
# instead of being retried from each later quote (that retrying is quadratic); valid JSON is cut the same either way.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_TOKEN = re.compile(_STRING.pattern + r"|[\[\]{}]", re.S)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONFileError(ValueError):
    """A package JSON file that is too large, too deep or not strict JSON: one line, the file's path first."""


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, refused (JSONFileError) when the file holds more than `limit` bytes: the size is taken
    from the open file before reading, and no more than limit + 1 bytes are read (a file that grows meanwhile)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise JSONFileError(f"{path}: {max(size, len(data))} bytes, more than the {_mib(limit)} a {what} may have")
    return data


def _mib(n: int) -> str:
    return f"{n >> 20} MiB ({n} bytes)"


def depth(text: str) -> int:
    """How deep arrays and objects nest in `text` (brackets inside strings do not count), without recursion."""
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def _line_too_deep(text: str, limit: int) -> int:
    """The line where nesting first goes past `limit` (only asked once `depth` has said it does)."""
    level = 0
    for m in _TOKEN.finditer(text):
        level += _STEP.get(m.group(), 0)
        if level > limit:
            return text.count("\n", 0, m.start()) + 1
    return 1


def _no_constant(name: str):
    raise JSONFileError(f"{name} is not JSON")


def _finite(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise JSONFileError(f"{s} is out of the range of a double")
    return x


def _integer(s: str) -> int:
    """An integer literal, refused where a double cannot hold its magnitude: JavaScript's JSON.parse reads 1e400
    and a 400-digit integer alike as Infinity (docs/package-format.md R3)."""
    x = int(s)
    try:
        float(x)
    except OverflowError:
        raise JSONFileError(f"{s[:20]}... is out of the range of a double") from None
    return x


def _object(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JSONFileError(f"duplicate key {_short(key)} (each key may appear once in an object)")
    return obj


def _short(value, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def loads(data: bytes, where: str | Path, max_depth: int = MAX_DEPTH):
    """Strict, bounded json.loads of a file's bytes (see the module): JSONFileError naming `where` (and the line,
    where the parser knows it) on any failure."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JSONFileError(f"{where}: not UTF-8 (byte {e.start})") from None
    if depth(text) > max_depth:
        raise JSONFileError(f"{where}:{_line_too_deep(text, max_depth)}: arrays and objects nested more than "
                            f"{max_depth} deep")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_integer,
                          object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise JSONFileError(f"{where}:{e.lineno}: invalid JSON ({e.msg})") from None
    except JSONFileError as e:
        raise JSONFileError(f"{where}: invalid JSON ({e})") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise JSONFileError(f"{where}: invalid JSON ({str(e).split(';')[0]})") from None


def read_json(path: str | Path, limit: int, what: str, max_depth: int = MAX_DEPTH):
    """`read_bounded` then `loads`: the value of a JSON file, or JSONFileError (one line naming the file)."""
    return loads(read_bounded(path, limit, what), path, max_depth)
