"""The `edgekit` command. Thin: options map onto config fields; errors become one line and exit code 2."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.errors import EdgekitError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Build small, fast on-device intent + slot packages (ExecuTorch and ONNX Runtime).")
RUNTIMES = ("executorch", "onnx")


def _quiet():
    """Keep the terminal for progress and results: library deprecation chatter is not the user's business."""
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING, format="edgekit: %(message)s", stream=sys.stderr)
    logging.getLogger("edgekit").setLevel(logging.INFO)
    # Import-time chatter from torch/torchao/onnx exporters; these loggers are not reset by torch's own setup.
    for name in ("torch.utils._pytree", "torch.onnx", "torch._export", "torch.export", "onnxscript", "executorch",
                 "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _runtime(value: str) -> str:
    if value not in RUNTIMES:
        raise EdgekitError(f"unknown --runtime {value!r}; choose {' or '.join(RUNTIMES)}")
    return value


@app.command()
def build(
    data: Annotated[Path, typer.Option(help="Dataset: JointBERT folder, CLINC150 JSON, CSV or JSONL.")],
    out: Annotated[Path, typer.Option(help="Output folder: the package, report.json and report.md.")],
    target: Annotated[str, typer.Option(help="Device profile: android, ios, server-gpu (devices/*.toml), or a path "
                                        "to your own .toml profile.")] = "android",
    task: Annotated[str, typer.Option(help="Task (intent: intent + slots when the data has slots).")] = "intent",
    format: Annotated[Optional[str], typer.Option(help="Force the data format: jointbert|clinc|csv|jsonl.")] = None,
    base_model: Annotated[Optional[Path], typer.Option(help="Local BERT-family folder (default: all-MiniLM-L6-v2).")]
    = None,
    config: Annotated[Optional[Path], typer.Option(help="A build.toml with the same tables as a profile.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="TABLE.KEY=VALUE (TOML value), repeatable, e.g. "
                                                     "distill.epochs=6 (docs/configuration.md).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for splits, initialisation and shuffling.")] = 0,
    stages: Annotated[Optional[str], typer.Option(help="Comma-separated stages (default: the profile's), e.g. "
                                                  "teacher,export,package to skip compression.")] = None,
    intents: Annotated[Optional[str], typer.Option(help="Comma-separated intents the package may answer (baked into "
                                                   "the graph; default: all).")] = None,
    cache: Annotated[Optional[Path], typer.Option(help="Stage cache folder (default: $EDGEKIT_CACHE, else "
                                                  "~/.cache/edgekit).")] = None,
    strict: Annotated[bool, typer.Option(help="Fail with no package when the accuracy budget is not met (default: "
                                         "ship the best try marked over budget, exit code 3).")] = False,
):
    """Fine-tune a teacher, compress and export it for the target's runtimes, and write a verified package.

    Stages whose inputs and settings did not change are reused from the stage cache."""
    from edgekit.build import BuildConfig
    from edgekit.build import build as run_build
    from edgekit.build.gating import OVER_BUDGET_EXIT

    # torch configures its own loggers on import; only its errors belong on the build's terminal.
    logging.getLogger("torch").setLevel(logging.ERROR)
    cfg = BuildConfig(data=str(data), out=str(out), task=task, target=target, format=format,
                      base_model=str(base_model) if base_model else None, config=str(config) if config else None,
                      sets=list(set_ or []), seed=seed, stages=stages.split(",") if stages else None,
                      intents=_names(intents), cache=str(cache) if cache else None, strict=strict)

    def show(name, row):
        figs = ", ".join(f"{k} {row[k]:.4f}" for k in ("intent_acc", "slot_f1", "exact_match", "in_scope_acc",
                                                       "oos_recall") if row.get(k) is not None)
        how = f"reused ({row['key']})" if row["reused"] else f"{row['seconds']:.1f}s"
        params = f"{row['params']:,} params, " if row.get("params") is not None else ""
        typer.echo(f"[{name}] {figs}, {params}{row['size_bytes'] or 0:,} bytes, {how}", err=True)

    rep = run_build(cfg, on_stage=show)
    lat = ", ".join(f"{k} p50 {v['p50_ms']:.2f} ms" for k, v in rep["latency"].items())
    typer.echo(f"package: {out} ({rep['package']['size_bytes']:,} bytes for {rep['package']['runtime']}); {lat}")
    typer.echo(f"report: {out / 'report.md'}")
    if rep.get("over_budget"):
        for o in rep["over_budget"]:
            typer.echo(f"over budget: {o['message']}; the package is the best try (report.md says so)", err=True)
        sys.exit(OVER_BUDGET_EXIT)


def _names(csv: str | None) -> list[str] | None:
    return [x.strip() for x in csv.split(",") if x.strip()] if csv is not None else None


@app.command()
def predict(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    text: str = typer.Argument(..., help="The utterance."),
    runtime: str = typer.Option("executorch", help="executorch or onnx."),
    tags: bool = typer.Option(False, help="Also print the per-word BIO tags."),
    allow_intents: Optional[str] = typer.Option(None, help="Comma-separated intents the answer may take "
                                                "(fills the graph's intent_mask; default: all)."),
    no_reject: bool = typer.Option(False, "--no-reject", help="Turn out-of-scope rejection off."),
):
    """Answer one utterance with a package: JSON with intent, confidence and slots."""
    from edgekit.runtime import Package, PackageError, Predictor

    try:
        pkg = Package.load(package)
    except PackageError as e:
        raise EdgekitError(str(e)) from None
    try:
        result = Predictor.open(pkg, _runtime(runtime)).predict(text, allow_intents=_names(allow_intents),
                                                                reject=not no_reject)
    except ValueError as e:
        raise EdgekitError(f"--allow-intents: {e}") from None
    if not tags:
        result.pop("tags", None)
    typer.echo(json.dumps(result, ensure_ascii=False))


@app.command(name="eval")
def eval_(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    data: Path = typer.Option(..., "--data", help="Dataset with the split to score."),
    runtime: str = typer.Option("executorch", help="executorch or onnx."),
    split: str = typer.Option("test", help="train, dev or test."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format."),
    compare_eager: bool = typer.Option(True, help="Also report agreement with the eager model, if checkpointed."),
    allow_intents: Optional[str] = typer.Option(None, help="Comma-separated intents the answers may take."),
    no_reject: bool = typer.Option(False, "--no-reject", help="Turn out-of-scope rejection off."),
):
    """Score a package by running it (tokenizer, runtime, decoder) on every utterance of a split."""
    from edgekit.evaluate import evaluate_package

    if split not in ("train", "dev", "test"):
        raise EdgekitError(f"unknown --split {split!r}; choose train, dev or test")
    typer.echo(json.dumps(evaluate_package(package, data, _runtime(runtime), split, format, compare_eager,
                                                _names(allow_intents), not no_reject), indent=2))


@app.command(name="bench")
def bench_(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    data: Path = typer.Option(..., "--data", help="Dataset whose utterances are timed."),
    runtime: str = typer.Option("executorch", help="executorch or onnx."),
    n: int = typer.Option(200, help="Utterances timed (each 3 times)."),
    threads: int = typer.Option(1, help="Runtime threads (1: as an app's foreground call)."),
    compare_teacher: bool = typer.Option(False, help="Also export the build's FP32 teacher the same way and time "
                                         "it in the same run; reports the speed-up."),
    split: str = typer.Option("test", help="train, dev or test."),
):
    """Single-utterance latency (p50/p99, after warm-up) of a package's model call on real utterances."""
    from edgekit.bench import bench

    if n < 1 or threads < 1:
        raise EdgekitError("--n and --threads must be >= 1")
    typer.echo(json.dumps(bench(package, data, _runtime(runtime), n, threads, compare_teacher, split), indent=2))


cache_app = typer.Typer(help="The stage cache: list or prune its entries.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
def cache_ls(cache: Annotated[Optional[Path], typer.Option(help="Cache folder (default: $EDGEKIT_CACHE, else "
                                                           "~/.cache/edgekit).")] = None):
    """One line per entry: stage, key, size, last use."""
    import time

    from edgekit.build.cache import StageCache, default_dir

    c = StageCache(default_dir(str(cache) if cache else None))
    entries = c.entries()
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["used"]))
        typer.echo(f"{e['stage']:12s} {e['key'][:12]}  {e['bytes'] / 1e6:9.2f} MB  {used}")
    typer.echo(f"{len(entries)} entries, {sum(e['bytes'] for e in entries) / 1e6:.1f} MB in {c.root}")


@cache_app.command("prune")
def cache_prune(
    cache: Annotated[Optional[Path], typer.Option(help="Cache folder.")] = None,
    older_than: Annotated[Optional[float], typer.Option(help="Remove entries unused for this many days.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
):
    """Remove entries unused for --older-than DAYS, or --all."""
    from edgekit.build.cache import StageCache, default_dir

    if older_than is None and not all_:
        raise EdgekitError("cache prune: give --older-than DAYS or --all")
    if older_than is not None and older_than < 0:
        raise EdgekitError(f"--older-than must be >= 0, got {older_than}")
    c = StageCache(default_dir(str(cache) if cache else None))
    n, freed = c.prune(None if all_ else older_than)
    typer.echo(f"removed {n} entries, {freed / 1e6:.1f} MB")


@app.command()
def targets():
    """List the device profiles in devices/."""
    from edgekit.targets import available, load_target

    for name in available():
        t = load_target(name)
        typer.echo(f"{name:12s} {', '.join(t.runtimes):18s} {t.description}")


def main() -> None:
    _quiet()
    try:
        app()
    except EdgekitError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
