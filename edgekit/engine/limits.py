"""Size and latency budgets: `--max-size 2MB`, `--max-latency 0.4ms`, or the profile's `[limits]` table.

Not `[budget]`: that table is the accuracy budget, and it enters the trim and distill cache keys. No stage reads
`[limits]`, so a budget changes no cache key: it is checked before any work (a size no package of this data can
reach), then held against the package the build wrote (report.json `limits`; a miss is an over-budget entry and
exit code 3, the package written and marked so).

Size is what report.json's `package.size_bytes` counts: the primary runtime's files (model, tokenizer, labels,
manifest, schema), what an app ships with that runtime alone. Latency is the p50 the package stage measures (its
utterances, its threads) on the build machine: not a phone's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SIZE_UNITS = {"B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
TIME_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_AMOUNT = re.compile(r"\s*(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*")  # NUMBER UNIT


def _amount(value, units: dict[str, float], bare: str) -> float | None:
    """A positive finite amount in the unit `bare`, from a number (in `bare`) or a string NUMBER UNIT (a sign is
    no number here); None and "none" give None (no budget: how a profile or a build lifts one it inherits, as TOML
    has no null). ValueError (no message: the caller words it) otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, (int, float)):
        number, unit = float(value), bare
    else:
        m = _AMOUNT.fullmatch(str(value))
        if not m or (m.group(2) or bare) not in units:
            raise ValueError
        number, unit = float(m.group(1)), m.group(2) or bare
    amount = number * units[unit] / units[bare]
    if not (math.isfinite(amount) and amount > 0):
        raise ValueError
    return amount


def parse_size(value) -> int | None:
    """Bytes from `2000000`, `"2MB"`, `"1.5 MiB"` (units B, KB, MB, GB, KiB, MiB, GiB; a bare number is bytes);
    None or "none": no budget; ValueError naming the field otherwise."""
    try:
        amount = _amount(value, SIZE_UNITS, "B")
    except ValueError:
        raise ValueError(f"max_size must be a size above 0, a number with a unit ({', '.join(SIZE_UNITS)}) "
                         f"as in --max-size 2MB, got {value!r}") from None
    if amount is not None and amount < 1:
        raise ValueError(f"max_size must be at least 1 byte, got {value!r}")
    return None if amount is None else math.floor(amount)


def parse_latency(value) -> float | None:
    """Milliseconds from `0.4`, `"0.4ms"`, `"400us"`, `"0.0004s"` (a bare number is ms); None or "none": no budget;
    ValueError naming the field otherwise."""
    try:
        return _amount(value, TIME_UNITS, "ms")
    except ValueError:
        raise ValueError(f"max_latency must be a time above 0, a number with a unit ({', '.join(TIME_UNITS)}) "
                         f"as in --max-latency 0.4ms, got {value!r}") from None


@dataclass
class LimitsSettings:
    """The package's size and latency budgets (None: none). Given as numbers or strings with units; held as
    bytes and milliseconds once checked."""

    max_size: int | float | str | None = None  # bytes once checked
    max_latency: float | str | None = None  # milliseconds once checked

    def __post_init__(self):
        self.max_size = parse_size(self.max_size)
        self.max_latency = parse_latency(self.max_latency)


def size_floor(fixed: dict[str, int], max_size: int | None) -> None:
    """ValueError when `max_size` is below what the package's fixed files alone take ({name: bytes}: the schema,
    labels.json), before any model or tokenizer: no shape can meet it."""
    need = sum(fixed.values())
    if max_size is not None and max_size < need:
        parts = ", ".join(f"{name} {n:,}" for name, n in fixed.items())
        raise ValueError(f"max_size {max_size:,} bytes is less than the {need:,} bytes a package of this data takes "
                         f"before any model or tokenizer ({parts}): no model fits")


def held(limits: LimitsSettings, package: dict, latency: dict) -> tuple[dict, list[dict]]:
    """The budgets against the package written: (report.json's `limits`, over-budget entries). package: report.json's
    `package` (size_bytes, runtime); latency: its `latency` ({runtime: {"p50_ms", ...}})."""
    out, over = {}, []
    if limits.max_size is not None:
        size = package["size_bytes"]
        out["size"] = {"max_bytes": limits.max_size, "bytes": size, "met": size <= limits.max_size,
                       "counts": f"{package['runtime']}'s files"}
        if size > limits.max_size:
            over.append({"stage": "package", "budget": "limits.max_size",
                         "message": f"limits.max_size: the package is {size:,} bytes, {size - limits.max_size:,} over "
                                    f"the {limits.max_size:,}-byte budget ({package['runtime']}'s files)"})
    if limits.max_latency is not None:
        p50 = (latency.get(package["runtime"]) or {}).get("p50_ms")
        out["latency"] = {"max_ms": limits.max_latency, "p50_ms": p50, "met": p50 is not None and p50 <=
                          limits.max_latency, "where": "the build machine's p50 (package stage), not a phone's"}
        if not out["latency"]["met"]:
            got = "was not measured" if p50 is None else f"is {p50:.3f} ms, {p50 - limits.max_latency:.3f} ms over"
            over.append({"stage": "package", "budget": "limits.max_latency",
                         "message": f"limits.max_latency: the package's p50 on this machine {got} the "
                                    f"{limits.max_latency:g} ms budget"})
    return out, over
