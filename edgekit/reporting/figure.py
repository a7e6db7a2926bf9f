"""A figure's start and end for every plot of edgekit.reporting: headless matplotlib (imported here, lazily), and
the PNG written to a temp name and renamed, so a reader never sees half a file."""

from __future__ import annotations

import os
from pathlib import Path


def figure(w: float = 6.4, h: float = 4.2):
    """(pyplot, figure, axes) of one gridded plot, w x h inches at 110 dpi."""
    import matplotlib

    matplotlib.use("Agg")  # no display: builds run headless
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(w, h), dpi=110)
    ax.grid(True, alpha=0.3)
    return plt, fig, ax


def save(plt, fig, path: Path) -> Path:
    """Lay `fig` out, write it to `path` (temp file, then rename) and close it."""
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
