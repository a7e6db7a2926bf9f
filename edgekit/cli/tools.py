"""`edgekit compare` (device against server) and `edgekit doctor` (this machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.cli.options import Format, command
from edgekit.errors import EdgekitError


@command()
def compare(
    device: Annotated[Path, typer.Argument(help="The device package (e.g. an android build).")],
    server: Annotated[str, typer.Argument(help="A server package folder (started here with edgekit serve, stopped "
                                          "after) or the URL of a running edgekit serve on this machine.")],
    data: Annotated[Path, typer.Option("--data", help="The dataset both were built on: dev calibrates the cascade, "
                                       "test is measured.")],
    format: Format = None,
    out: Annotated[Path, typer.Option(help="Folder for compare.json, compare.md (the table) and the plots.")]
    = Path("compare"),
    n: Annotated[int, typer.Option(help="Test utterances timed one by one on each side.")] = 300,
    load_seconds: Annotated[float, typer.Option(help="Length of the `high` load test against the server.")] = 20.0,
    record: Annotated[bool, typer.Option(help="Write the chosen cascade threshold into the device manifest.")] = True,
):
    """Compare a device package with a server side by side, and choose the cascade.

    Size, accuracy and latency on the same utterances (device in process; server over loopback HTTP, alone and
    under load; plus modeled network round trips), and the device-first cascade with its threshold chosen on dev."""
    from rich.console import Console

    from edgekit.runtime import Package
    from edgekit.tools import compare as cmp

    Package.load(device)  # both checked before anything starts (a bad one: main's `error:` line, exit 2)
    if not server.startswith(("http://", "https://")):
        Package.load(server)
    try:  # CompareConfig owns the limits; its message names its fields, the user typed the flags
        cfg = cmp.CompareConfig(latency_n=n, load_seconds=load_seconds)
    except ValueError as e:
        raise EdgekitError(str(e).replace("latency_n", "--n").replace("load_seconds", "--load-seconds")) from None
    res = cmp.compare(device, server, str(data), cfg, log=lambda m: typer.echo(m, err=True), fmt=format)
    Console(width=max(120, Console().width)).print(cmp.table(res))
    for line in cmp.finish(res, device, out, record):
        typer.echo(line)


@command()
def doctor(
    package: Annotated[Optional[Path], typer.Argument(help="A package folder to verify as well.")] = None,
):
    """Check this machine (and a package), each problem with its fix.

    Versions, the ExecuTorch runtime and XNNPACK, ONNX Runtime's providers and the GPU, CPU features, disk and
    cache, the base model, and a package if given. Exit 1 when something required is broken
    (docs/troubleshooting.md lists the errors users meet)."""
    from rich.console import Console

    from edgekit.runtime.package import package_dir
    from edgekit.tools import doctor as dr

    if package is not None:  # a mistyped argument is bad input, not a broken machine
        package_dir(package)
    checks = dr.run(package)
    Console(width=max(100, Console().width)).print(dr.table(checks))
    for line in dr.fix_lines(checks):  # whole lines a user can copy (a table cell may wrap a command)
        typer.echo(line, err=True)
    bad = dr.failed(checks)
    if bad:
        typer.echo(f"{len(bad)} required check(s) failed: {', '.join(c.name for c in bad)}", err=True)
        raise typer.Exit(1)
    typer.echo("all required checks passed")
