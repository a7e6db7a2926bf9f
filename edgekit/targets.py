"""Target device profiles, read from the TOML files in `devices/` (no per-device if-chains in code)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from edgekit.errors import EdgekitError


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtimes: list[str]
    primary_runtime: str
    bench_threads: int = 1
    stages: list[str] = field(default_factory=lambda: ["teacher", "export", "package"])
    budget: dict = field(default_factory=dict)  # accuracy drop allowed against the teacher on dev, in points
    compress: dict = field(default_factory=dict)  # vocabulary and parameter budgets, distillation settings
    quantize: dict = field(default_factory=dict)  # QuantizeConfig fields (INT8 calibration, embeddings, budget)
    # ExecuTorch length buckets: these percentiles of the data's piece counts, rounded up to a multiple of 8,
    # become extra fixed lengths below max_len ([] : one length)
    bucket_percentiles: list[int] = field(default_factory=lambda: [50, 90])


def available() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("edgekit.devices").iterdir() if p.name.endswith(".toml"))


def load_target(name: str) -> Target:
    """The profile `devices/<name>.toml`, or a user's own profile given as a path to a .toml file."""
    if name.endswith(".toml"):
        path = Path(name)
        if not path.is_file():
            raise EdgekitError(f"{name}: target profile file not found")
        text, where = path.read_text(encoding="utf-8"), name
    else:
        f = resources.files("edgekit.devices").joinpath(f"{name}.toml")
        if not f.is_file():
            raise EdgekitError(f"unknown --target {name!r}; known targets: {', '.join(available())} "
                               "(or a path to a .toml profile)")
        text, where = f.read_text(encoding="utf-8"), f"devices/{name}.toml"
    try:
        data = tomllib.loads(text)
        return Target(**data)
    except tomllib.TOMLDecodeError as e:
        raise EdgekitError(f"{where}: {e}") from None
    except TypeError as e:
        raise EdgekitError(f"{where}: {e}") from None
