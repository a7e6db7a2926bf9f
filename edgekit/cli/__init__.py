"""The `edgekit` command. Thin: options map onto API calls; errors become one line and exit code 2.

Every command is a function declared with `@command` (edgekit.cli.options) in the module of its concern; MENU
below is the order `edgekit --help` lists them in. Options several commands share live in options.py.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from edgekit.cli import build, cache, data, package, serving, tools  # noqa: F401  (their commands register on import)
from edgekit.cli.options import COMMANDS, GROUPS, quiet
from edgekit.errors import EdgekitError

MENU = ("build", "data", "predict", "eval", "bench", "serve", "web", "loadtest", "cache", "verify", "compare",
        "profile", "doctor", "targets")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Build small, fast on-device intent + slot packages (ExecuTorch and ONNX Runtime).")


def _version(value: bool):
    if value:
        from edgekit import __version__

        typer.echo(f"edgekit {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print edgekit's version and exit.")] = False):
    pass  # the app's help is Typer(help=...)'s


def _register() -> None:
    """Every declared command onto the app, in MENU's order (a group's sub-commands onto a sub-app)."""
    groups = {name: typer.Typer(help=text, no_args_is_help=True) for name, text in GROUPS.items()}
    for name in MENU:
        if name in groups:
            for c in COMMANDS:
                if c.group == name:
                    groups[name].command(c.name)(c.fn)
            app.add_typer(groups[name], name=name)
        else:
            (c,) = [c for c in COMMANDS if c.name == name and c.group is None]
            app.command(c.name)(c.fn)
    missing = {c.name for c in COMMANDS if c.group is None} - set(MENU)
    assert not missing, f"commands not in MENU: {missing}"


_register()


def one_line(message: str) -> str:
    """An error message as one line: characters that would break or hide it (a newline in a path) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def main() -> None:
    from edgekit.runtime.package import PackageError

    quiet()
    try:
        app()
    except (EdgekitError, PackageError, OSError) as e:
        # PackageError: a package that is not what the command needs (e.g. no model for --runtime); OSError: a path
        # the system refuses (a name too long, a loop of links)
        msg = f"{e.filename}: {e.strerror or e}" if isinstance(e, OSError) and e.filename else str(e)
        typer.echo(f"error: {one_line(msg)}", err=True)
        sys.exit(getattr(e, "exit_code", 2))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
