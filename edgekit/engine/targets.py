"""Target device profiles, read from the TOML files in `devices/` (no per-device if-chains in code).

A profile has top-level facts (runtimes, stages, threads) and setting tables ([teacher], [compress], [distill],
[quantize], [decoding], [budget], [package]; see edgekit.engine.config). `extends = "android"` starts from
another profile and states only the differences.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.runtime.package import RUNTIMES

# each top-level fact's type: a profile with another is refused naming the key (TOML has no bool/int confusion
# here, but a quoted "2" or a list of strings where numbers go is a typo to catch before any work)
FACTS = {"name": str, "description": str, "runtimes": (list, str), "primary_runtime": str, "bench_threads": int,
         "stages": (list, str), "bucket_percentiles": (list, int), "base_model": str}


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtimes: list[str]
    primary_runtime: str
    bench_threads: int = 1
    stages: list[str] = field(default_factory=lambda: ["teacher", "export", "package"])
    # ExecuTorch length buckets: these percentiles of the data's piece counts, rounded up to a multiple of 8,
    # become extra fixed lengths below max_len ([] : one length)
    bucket_percentiles: list[int] = field(default_factory=lambda: [50, 90])
    # the base model a build without --base-model starts from (a name in base_models.toml); None: minilm
    base_model: str | None = None
    tables: dict = field(default_factory=dict)  # setting tables, validated by edgekit.engine.config
    source: str = ""  # where the profile was read from, for messages


def available() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("edgekit.devices").iterdir() if p.name.endswith(".toml"))


def merge_tables(base: dict, over: dict) -> dict:
    """Table-wise merge: keys of `over` replace those of `base`; nested tables merge."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_tables(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(name: str) -> tuple[dict, str]:
    if name.endswith(".toml"):
        path = Path(name)
        if not path.is_file():
            raise EdgekitError(f"{name}: target profile file not found")
        try:
            text, where = path.read_text(encoding="utf-8"), name
        except (OSError, UnicodeDecodeError) as e:
            raise EdgekitError(f"{name}: cannot read the target profile ({getattr(e, 'strerror', None) or e})") \
                from None
    else:
        f = resources.files("edgekit.devices").joinpath(f"{name}.toml")
        if not f.is_file():
            raise EdgekitError(f"unknown --target {name!r}; known targets: {', '.join(available())} "
                               "(or a path to a .toml profile)")
        text, where = f.read_text(encoding="utf-8"), f"devices/{name}.toml"
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as e:
        raise EdgekitError(f"{where}: {e}") from None


def load_target(name: str, _seen: tuple = ()) -> Target:
    """The profile `devices/<name>.toml`, or a user's own profile given as a path to a .toml file."""
    data, where = _read(name)
    parent = data.pop("extends", None)
    if parent is not None and not isinstance(parent, str):
        raise EdgekitError(f"{where}: extends must be a profile name or a .toml path, got {parent!r}")
    if parent and parent.endswith(".toml") and not Path(parent).is_absolute() and name.endswith(".toml"):
        parent = str(Path(name).parent / parent)  # relative to the profile that extends it
    if parent:
        if parent in _seen:
            raise EdgekitError(f"{where}: extends {parent!r} in a loop")
        base = load_target(parent, _seen + (name,))
        merged = {f.name: getattr(base, f.name) for f in fields(Target) if f.name not in ("tables", "source")}
        merged["tables"] = base.tables
    else:
        merged = {"tables": {}}
    known = {f.name for f in fields(Target)} - {"tables", "source"}
    for k, v in data.items():
        if isinstance(v, dict):
            merged["tables"] = merge_tables(merged["tables"], {k: v})
        elif k in known:
            _check_fact(where, k, v)
            merged[k] = v
        else:
            raise EdgekitError(f"{where}: unknown profile key {k!r}")
    try:
        target = Target(**merged, source=where)
    except TypeError as e:
        raise EdgekitError(f"{where}: {e}") from None
    bad = [r for r in target.runtimes if r not in RUNTIMES]
    if bad or not target.runtimes:
        raise EdgekitError(f"{where}: runtimes must be some of {', '.join(RUNTIMES)}, got {target.runtimes}")
    if target.primary_runtime not in target.runtimes:
        raise EdgekitError(f"{where}: primary_runtime {target.primary_runtime!r} is not in runtimes {target.runtimes}")
    if target.bench_threads < 1:
        raise EdgekitError(f"{where}: bench_threads must be >= 1, got {target.bench_threads}")
    if any(not 0 <= q <= 100 for q in target.bucket_percentiles):
        raise EdgekitError(f"{where}: bucket_percentiles are percentiles, 0 to 100, got {target.bucket_percentiles}")
    return target


def _check_fact(where: str, key: str, value) -> None:
    kind = FACTS[key]
    outer, inner = kind if isinstance(kind, tuple) else (kind, None)
    ok = isinstance(value, outer) and not isinstance(value, bool)
    if ok and inner is not None:
        ok = all(isinstance(x, inner) and not isinstance(x, bool) for x in value)
    if not ok:
        want = f"a list of {inner.__name__}" if inner else outer.__name__
        raise EdgekitError(f"{where}: {key} must be {want}, got {value!r}")
