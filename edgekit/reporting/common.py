"""What the sections of report.md share: how a number and a size are written, and a pass's record."""

from __future__ import annotations


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def size(n) -> str:
    return "—" if n is None else f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def pass_of(rep: dict, name: str) -> dict | None:
    """The build's record of one pass, None when it did not run."""
    return next((p for p in rep.get("passes", []) if p["name"] == name), None)
