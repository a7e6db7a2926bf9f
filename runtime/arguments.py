"""The argument contract of Predictor.open, predict and predict_batch: every option's type, shape and range is
checked here, before any tensor is made (a tensor of the wrong shape can abort ExecuTorch's C++ runtime, past any
except clause). A wrong type is a TypeError, a bad value a ValueError (InputError for text), each one line naming
the parameter."""

from __future__ import annotations

import math
import os
import reprlib
from collections.abc import Iterable, Mapping

import numpy as np

from edgekit.runtime.backends import BACKENDS
from edgekit.runtime.package import Package
from edgekit.runtime.providers import PROVIDERS

MAX_THREADS = 256  # above any core count; a huge count would have ONNX Runtime try to start that many threads
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 40
NOT_A_LIST = (str, bytes, bytearray, Mapping)  # iterable, but never meant as a list of names or values


def shown(value) -> str:
    """A caller's value as an error message shows it: short, on one line."""
    try:
        return " ".join(_SHOW.repr(value).split())
    except Exception:  # a caller's object whose repr fails still gets a message
        return f"a {type(value).__name__}"


def check_bool(name: str, value) -> bool:
    """`value` as a Python bool; TypeError unless it is one (numpy's bool too): None, 0, "no" and NaN are not."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {shown(value)}")


def is_list(value) -> bool:
    """An iterable a caller may give as a list (list, tuple, generator, array...): not a str, bytes or dict."""
    return isinstance(value, Iterable) and not isinstance(value, NOT_A_LIST)


def check_names(name: str, value, what: str = "intent names") -> list[str] | None:
    """None, or a list of str from any iterable but a str (read once: a generator works); else TypeError."""
    if value is None:
        return None
    if not is_list(value):
        raise TypeError(f"{name}: expected a list of {what} or None, got {shown(value)}")
    names = list(value)  # a generator is read once, here; everything after uses the list
    bad = [a for a in names if not isinstance(a, str)]
    if bad:
        raise TypeError(f"{name}: {what} are str, got {shown(bad[0])}")
    return names


def batch_allow(value, n: int) -> tuple[list[str] | None, list]:
    """predict_batch's allow_intents for n texts -> (the list of names for all texts, or None; n entries, each None
    or a value for check_names). None allows every intent everywhere."""
    if value is None:
        return None, [None] * n
    if not is_list(value):
        raise TypeError(f"allow_intents: expected None, a list of intent names or one entry per text, got "
                        f"{shown(value)}")
    items = list(value)
    if items and all(isinstance(a, str) for a in items):
        return items, [items] * n
    if any(isinstance(a, str) for a in items):
        raise TypeError(f"allow_intents: give one list of intent names for all texts or one entry (None or a list "
                        f"of names) per text, not both, got {shown(items)}")
    rows = [check_names(f"allow_intents[{k}]", a) for k, a in enumerate(items)]
    if len(rows) != n:
        raise ValueError(f"allow_intents: {len(rows)} entries for {n} texts; give a non-empty list of intent names "
                         "for all, or one entry per text")
    return None, rows


def batch_reject(value, n: int) -> list[bool]:
    """predict_batch's reject for n texts: one bool for all, or a list of bools, one per text."""
    if isinstance(value, (bool, np.bool_)):
        return [bool(value)] * n
    if not is_list(value):
        raise TypeError(f"reject: expected True or False, or one of them per text, got {shown(value)}")
    rows = [check_bool(f"reject[{k}]", r) for k, r in enumerate(list(value))]
    if len(rows) != n:
        raise ValueError(f"reject: {len(rows)} values for {n} texts; give one per text, or one for all")
    return rows


MAX_TIMEOUT_S = 3600.0  # a server's answer waited for at most an hour: sockets refuse far larger timeouts


def check_number(name: str, value, low: float, high: float, low_open: bool = False) -> None:
    """None, or a real number (not a bool) in [low, high] ((low, high] with low_open)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number or None, got {shown(value)}")
    # an int too large for a float compares exactly; only floats can be NaN (every comparison False) or infinite
    if not ((low < value if low_open else low <= value) and value <= high and value not in (math.inf, -math.inf)):
        raise ValueError(f"{name}: expected a number in {'(' if low_open else '['}{low:g}, {high:g}], got "
                         f"{shown(value)}")


def check_open(package, runtime, threads, providers, digest, fallback_url, spin) -> list[str] | None:
    """Predictor.open's arguments but the numbers (check_number) -> providers, read once."""
    if not isinstance(package, (str, os.PathLike, Package)):
        raise TypeError(f"package: expected a package folder (str or Path) or a Package, got {shown(package)}")
    if not isinstance(runtime, str):
        raise TypeError(f"runtime: expected one of {', '.join(BACKENDS)}, got {shown(runtime)}")
    if runtime not in BACKENDS:
        raise ValueError(f"runtime: unknown runtime {shown(runtime)}; choose {', '.join(BACKENDS)}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))):
        raise TypeError(f"threads: expected an int or None, got {shown(threads)}")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads: expected 1 to {MAX_THREADS}, got {shown(threads)}")
    for name, value in (("digest", digest), ("fallback_url", fallback_url)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name}: expected a str or None, got {shown(value)}")
    check_bool("spin", spin)
    names = check_names("providers", providers, "provider names")
    unknown = [p for p in names or [] if p not in PROVIDERS]
    if unknown:
        raise ValueError(f"providers: unknown provider {shown(unknown[0])}; choose from {', '.join(PROVIDERS)}")
    return names
