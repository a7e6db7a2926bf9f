"""What every command shares: the one way a command is declared (`@command`), the options several commands
take (declared once, with their help), and the small conversions from flags to API values."""

from __future__ import annotations

import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from edgekit.errors import EdgekitError
from edgekit.runtime.jsonfile import MANIFEST_BYTES, read_json
from edgekit.runtime.package import MANIFEST, RUNTIMES, PackageError, check_manifest


@dataclass(frozen=True)
class Command:
    fn: Callable
    name: str
    group: str | None = None  # a sub-command of this group (`edgekit cache ls`)


COMMANDS: list[Command] = []
GROUPS = {"cache": "The stage cache: list or prune its entries.",  # group -> its one-line help
          "data": "A dataset checked before a build: duplicates, leakage, label conflicts, truncation."}


def command(name: str | None = None, group: str | None = None):
    """Declare a command: its docstring's first line is its entry in `edgekit --help`, the rest its own --help."""
    def register(fn):
        COMMANDS.append(Command(fn, name or fn.__name__.rstrip("_").replace("_", "-"), group))
        return fn
    return register


# Options that several commands take, each declared once.
Package = Annotated[Path, typer.Argument(help="Package folder written by `edgekit build`.")]
Format = Annotated[Optional[str], typer.Option("--format", help="Force the data format: "
                                               "jointbert|clinc|csv|jsonl|split-files (docs/data-formats.md).")]
Runtime = Annotated[Optional[str], typer.Option(help=f"{' or '.join(RUNTIMES)} (default: the package's primary).")]
HeldOutSplit = Annotated[str, typer.Option(help="train, dev, test, or all (every utterance, none drawn: a held-out "
                                           "file of your own).")]
AllowIntents = Annotated[Optional[str], typer.Option(help="Comma-separated intents the answers may take (fills the "
                                                     "graph's intent_mask; default: all).")]
NoReject = Annotated[bool, typer.Option("--no-reject", help="Turn out-of-scope rejection off.")]
Provider = Annotated[Optional[list[str]], typer.Option(help="ONNX Runtime provider to try, in order, repeatable: "
                                                       "tensorrt, cuda, cpu (default: the package's).")]
CacheDir = Annotated[Optional[Path], typer.Option(help="Stage cache folder (default: $EDGEKIT_CACHE, else "
                                                  "$XDG_CACHE_HOME/edgekit, else ~/.cache/edgekit).")]


def quiet() -> None:
    """Keep the terminal for progress and results: library deprecation chatter is not the user's business."""
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING, format="edgekit: %(message)s", stream=sys.stderr)
    logging.getLogger("edgekit").setLevel(logging.INFO)
    # Import-time chatter from torch/torchao/onnx exporters; these loggers are not reset by torch's own setup.
    for name in ("torch.utils._pytree", "torch.onnx", "torch._export", "torch.export", "onnxscript", "executorch",
                 "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


def runtime_of(value: str | None, package: Path | None = None) -> str:
    """--runtime, or the package's primary runtime when not given."""
    if value is None and package is not None:
        try:  # through the one parse path: a field is used only once the manifest's schema has accepted it
            return check_manifest(read_json(package / MANIFEST, MANIFEST_BYTES, "manifest"))["primary_runtime"]
        except (OSError, ValueError, PackageError):
            return "executorch"  # the package's own check (Package.load) reports what is wrong with it
    if value not in RUNTIMES:
        raise EdgekitError(f"unknown --runtime {value!r}; choose {' or '.join(RUNTIMES)}")
    return value


def names(csv: str | None) -> list[str] | None:
    """'a, b,' -> ['a', 'b']; None stays None."""
    return [x.strip() for x in csv.split(",") if x.strip()] if csv is not None else None


def check_providers(given: list[str] | None) -> list[str] | None:
    """--provider names, checked against edgekit.runtime.providers; None when none was given."""
    from edgekit.runtime.providers import PROVIDERS

    bad = [p for p in given or [] if p not in PROVIDERS]
    if bad:
        raise EdgekitError(f"unknown --provider {bad[0]!r}; choose from {', '.join(PROVIDERS)}")
    return given or None


def check_counts(**values: int) -> None:
    """Counts a user typed (--n, --threads) that must be >= 1."""
    if any(v < 1 for v in values.values()):
        raise EdgekitError(" and ".join(f"--{k}" for k in values) + " must be >= 1")
