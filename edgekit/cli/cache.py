"""`edgekit cache ls|prune`: the stage cache's entries, listed or removed (edgekit.engine.cache owns the cache)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from edgekit.cli.options import CacheDir, command
from edgekit.errors import EdgekitError


@command("ls", group="cache")
def cache_ls(cache: CacheDir = None):
    """One line per entry: stage, key, size, last use."""
    import time

    from edgekit.engine.cache import StageCache, default_dir

    c = StageCache(default_dir(str(cache) if cache else None))
    if not c.root.is_dir():  # nothing was ever cached there, or a mistyped --cache: say which
        typer.echo(f"no stage cache in {c.root} (no build has used it yet)")
        return
    entries = c.entries()
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["used"]))
        typer.echo(f"{e['stage']:12s} {e['key'][:12]}  {e['bytes'] / 1e6:9.2f} MB  {used}")
    typer.echo(f"{len(entries)} entries, {sum(e['bytes'] for e in entries) / 1e6:.1f} MB in {c.root}")


@command("prune", group="cache")
def cache_prune(
    cache: CacheDir = None,
    older_than: Annotated[Optional[float], typer.Option(help="Remove entries unused for this many days.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
):
    """Remove entries unused for --older-than DAYS, or --all."""
    from edgekit.engine.cache import StageCache, default_dir

    if older_than is None and not all_:
        raise EdgekitError("cache prune: give --older-than DAYS or --all")
    if older_than is not None and older_than < 0:
        raise EdgekitError(f"--older-than must be >= 0, got {older_than}")
    c = StageCache(default_dir(str(cache) if cache else None))
    n, freed = c.prune(None if all_ else older_than)
    typer.echo(f"removed {n} entries, {freed / 1e6:.1f} MB")
