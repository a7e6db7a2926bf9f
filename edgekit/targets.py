"""Target device profiles, read from the TOML files in `devices/` (no per-device if-chains in code)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources

from edgekit.errors import EdgekitError


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtimes: list[str]
    primary_runtime: str
    bench_threads: int = 1
    budget: dict = field(default_factory=dict)


def available() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("edgekit.devices").iterdir() if p.name.endswith(".toml"))


def load_target(name: str) -> Target:
    """The profile `devices/<name>.toml`; an unknown name is an EdgekitError listing the known ones."""
    f = resources.files("edgekit.devices").joinpath(f"{name}.toml")
    if not f.is_file():
        raise EdgekitError(f"unknown --target {name!r}; known targets: {', '.join(available())}")
    try:
        data = tomllib.loads(f.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise EdgekitError(f"devices/{name}.toml: {e}") from None
    return Target(**data)
