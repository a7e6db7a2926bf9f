"""The latency summary every timing in edgekit reports: percentiles of milliseconds, one definition.

Percentiles interpolate linearly between the closest ranks (numpy's default), so a summary here, in `edgekit
bench`, in the build report, in `edgekit compare` and in `edgekit loadtest` means the same thing.
"""

from __future__ import annotations

import numpy as np


def percentile(ms: list[float], q: float, digits: int | None = None) -> float | None:
    """The q-th percentile (0-100) of `ms`; None when there is none. `digits`: rounded to that many decimals."""
    if len(ms) == 0:
        return None
    v = float(np.percentile(np.asarray(ms, dtype=float), q))
    return round(v, digits) if digits is not None else v


def summary(ms: list[float], qs: tuple[int, ...] = (50, 99), suffix: str = "_ms", digits: int | None = None) -> dict:
    """{"p50_ms": ..., "p99_ms": ..., "n": len(ms)}: the percentiles `qs`, keys `p<q><suffix>`."""
    return {**{f"p{q}{suffix}": percentile(ms, q, digits) for q in qs}, "n": len(ms)}
