"""The build engine. A build is one pass down these rooms:

registry (every stage's facts) -> config (settings resolved once) -> runner.prepare (data, base model, lengths) ->
for each stage: keys (its cache key) -> cache (reuse, or stages/<name>.run) -> report (report.json, report.md).
Gates and back-off: gating. Scoring inside a build: measure. The decoding graph's policy: decoding_policy.

`from edgekit.engine import BuildConfig, build` loads what a build needs only when asked (this package is also
imported for its cache and registry by tools that must not load torch).
"""

from __future__ import annotations

__all__ = ["BuildConfig", "Settings", "build", "resolve"]


def __getattr__(name: str):
    if name in ("BuildConfig", "Settings", "resolve"):
        from edgekit.engine import config

        return getattr(config, name)
    if name == "build":
        from edgekit.engine.runner import build

        return build
    raise AttributeError(name)
