"""The build engine: settings resolved once (config), a stage registry and run loop (runner), a stage cache
keyed by everything that made each stage's output (cache), gates (gating), one module per stage (stages/)."""

from edgekit.build.config import BuildConfig, Settings, resolve
from edgekit.build.runner import build

__all__ = ["BuildConfig", "Settings", "build", "resolve"]
