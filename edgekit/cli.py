"""The `edgekit` command. Thin: options map onto config fields; errors become one line and exit code 2."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.cache_cli import cache_app
from edgekit.errors import EdgekitError
from edgekit.serve_cli import check_providers, loadtest, serve, web

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Build small, fast on-device intent + slot packages (ExecuTorch and ONNX Runtime).")
RUNTIMES = ("executorch", "onnx")


def _version(value: bool):
    if value:
        from edgekit import __version__

        typer.echo(f"edgekit {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print edgekit's version and exit.")] = False):
    pass  # the app's help is Typer(help=...)'s


def _quiet():
    """Keep the terminal for progress and results: library deprecation chatter is not the user's business."""
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING, format="edgekit: %(message)s", stream=sys.stderr)
    logging.getLogger("edgekit").setLevel(logging.INFO)
    # Import-time chatter from torch/torchao/onnx exporters; these loggers are not reset by torch's own setup.
    for name in ("torch.utils._pytree", "torch.onnx", "torch._export", "torch.export", "onnxscript", "executorch",
                 "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _runtime(value: str | None, package: Path | None = None) -> str:
    """--runtime, or the package's primary runtime when not given."""
    if value is None and package is not None:
        try:
            return json.loads((package / "manifest.json").read_text(encoding="utf-8"))["primary_runtime"]
        except (OSError, ValueError, KeyError, TypeError):
            return "executorch"  # the package's own check reports what is wrong with it
    if value not in RUNTIMES:
        raise EdgekitError(f"unknown --runtime {value!r}; choose {' or '.join(RUNTIMES)}")
    return value


@app.command()
def build(
    data: Annotated[Path, typer.Option(help="Dataset: JointBERT folder, CLINC150 JSON, CSV or JSONL.")],
    out: Annotated[Path, typer.Option(help="Output folder: the package, report.json and report.md.")],
    target: Annotated[str, typer.Option(help="Device profile: android, ios, web, server-cpu, server-gpu "
                                        "(devices/*.toml), or a path to your own .toml profile.")] = "android",
    task: Annotated[str, typer.Option(help="Task (intent: intent + slots when the data has slots).")] = "intent",
    format: Annotated[Optional[str], typer.Option(help="Force the data format: jointbert|clinc|csv|jsonl|split-files "
                                                  "(docs/data-formats.md).")] = None,
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
                                                  "$XDG_CACHE_HOME/edgekit, else ~/.cache/edgekit).")] = None,
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
    if rep["package"].get("digest"):
        typer.echo(f"digest: sha256:{rep['package']['digest']} (pin it: edgekit verify {out} --digest ...)")
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
    runtime: Optional[str] = typer.Option(None, help="executorch or onnx (default: the package's primary)."),
    tags: bool = typer.Option(False, help="Also print the per-word BIO tags."),
    allow_intents: Optional[str] = typer.Option(None, help="Comma-separated intents the answer may take "
                                                "(fills the graph's intent_mask; default: all)."),
    no_reject: bool = typer.Option(False, "--no-reject", help="Turn out-of-scope rejection off."),
    fallback: Optional[str] = typer.Option(None, help="An `edgekit serve` URL asked when the device is unsure "
                                           "(confidence below the manifest's cascade.threshold, or --escalate-below; "
                                           "never for a text that says nothing)."),
    escalate_below: Optional[float] = typer.Option(None, help="With --fallback: the confidence below which the "
                                                   "server answers."),
):
    """Answer one utterance with a package: JSON with intent, confidence and slots (with --fallback, also
    `escalated`, and `fallback` when the server could not answer in time)."""
    from edgekit.runtime import Predictor
    from edgekit.runtime.tokenizer import InputError

    if escalate_below is not None and fallback is None:
        raise EdgekitError("--escalate-below: needs --fallback URL, the server it escalates to")
    try:  # a bad package is one `error:` line and exit 2 (main)
        pred = Predictor.open(package, _runtime(runtime, package), fallback_url=fallback, escalate_below=escalate_below)
    except ValueError as e:  # the API names its parameters; the user typed the flags
        msg = str(e)
        raise EdgekitError(f"--escalate-below{msg.removeprefix('escalate_below')}" if msg.startswith("escalate_below:")
                           else f"--fallback: {msg}") from None
    try:
        result = pred.predict(text, allow_intents=_names(allow_intents), reject=not no_reject)
    except InputError as e:  # e.g. bytes that are not UTF-8 on the command line
        raise EdgekitError(f"text: {e}") from None
    except ValueError as e:
        raise EdgekitError(f"--allow-intents: {e}") from None
    if not tags:
        result.pop("tags", None)
    typer.echo(json.dumps(result, ensure_ascii=False))


@app.command(name="eval")
def eval_(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    data: Path = typer.Option(..., "--data", help="Dataset with the split to score."),
    runtime: Optional[str] = typer.Option(None, help="executorch or onnx (default: the package's primary)."),
    split: str = typer.Option("test", help="train, dev, test, or all (every utterance, none drawn: a "
                              "held-out file of your own)."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format."),
    compare_eager: bool = typer.Option(True, help="Also report agreement with the eager model, if checkpointed."),
    allow_intents: Optional[str] = typer.Option(None, help="Comma-separated intents the answers may take."),
    no_reject: bool = typer.Option(False, "--no-reject", help="Turn out-of-scope rejection off."),
):
    """Score a package by running it (tokenizer, runtime, decoder) on every utterance of a split."""
    from edgekit.evaluate import evaluate_package

    typer.echo(json.dumps(evaluate_package(package, data, _runtime(runtime, package), split, format, compare_eager,
                                                _names(allow_intents), not no_reject), indent=2))


@app.command(name="bench")
def bench_(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    data: Path = typer.Option(..., "--data", help="Dataset whose utterances are timed."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format."),
    runtime: Optional[str] = typer.Option(None, help="executorch or onnx (default: the package's primary)."),
    n: int = typer.Option(200, help="Utterances timed (each 3 times)."),
    threads: int = typer.Option(1, help="Runtime threads (1: as an app's foreground call)."),
    compare_teacher: bool = typer.Option(False, help="Also export the build's FP32 teacher the same way and time "
                                         "it in the same run; reports the speed-up."),
    split: str = typer.Option("test", help="train, dev, test, or all (every utterance, none drawn: a "
                              "held-out file of your own)."),
    batch: Optional[str] = typer.Option(None, help="Batch sizes, e.g. 1,8,32,128: throughput of a server "
                                        "package's batched graph at each (ONNX Runtime)."),
    provider: Optional[list[str]] = typer.Option(None, help="ONNX Runtime provider to try, in order, repeatable: "
                                                 "tensorrt, cuda, cpu (default: the package's)."),
):
    """Single-utterance latency (p50/p99, after warm-up) of a package's model call on real utterances; with
    --batch, a server package's throughput by batch size."""
    from edgekit.bench import batch_throughput, bench
    from edgekit.data import package_split

    if n < 1 or threads < 1:
        raise EdgekitError("--n and --threads must be >= 1")
    check_providers(provider)
    if batch is None:
        rt = _runtime(runtime, package)
        if provider and rt != "onnx":
            raise EdgekitError(f"--provider picks ONNX Runtime's execution provider; this runs {rt} (--runtime onnx)")
        typer.echo(json.dumps(bench(package, data, rt, n, threads, compare_teacher, split, format, provider),
                              indent=2))
        return
    try:
        sizes = [int(b) for b in batch.split(",")]
    except ValueError:
        raise EdgekitError(f"--batch {batch!r}: comma-separated whole numbers, e.g. 1,8,32") from None
    if not sizes or min(sizes) < 1:
        raise EdgekitError("--batch sizes must be >= 1")
    texts = [ex.text for ex in package_split(data, package, split, format)[:n]]
    typer.echo(json.dumps(batch_throughput(str(package), texts, sizes, threads, provider), indent=2))


for command in (serve, web, loadtest):  # edgekit/serve_cli.py: the commands that run or drive a server
    app.command()(command)


app.add_typer(cache_app, name="cache")


@app.command()
def verify(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    digest: Optional[str] = typer.Option(None, help="The package digest you tested (sha256 of manifest.json, "
                                         "as `edgekit build` prints it); any other package is refused."),
):
    """Check a package without loading a model: the manifest's schema, every file listed and inside the folder
    with its sha256 and size, no stray files, and with --digest the manifest itself. One line per file; exit 2
    on any failure."""
    from edgekit.runtime.package import Package

    pkg = Package.load(package, digest=digest)  # a failure is one `error:` line and exit 2 (main)
    for name, meta in pkg.manifest["files"].items():
        typer.echo(f"ok  {name}  sha256:{meta['sha256'][:16]}…  {meta['bytes']:,} bytes")
    pkg.check_strays()
    typer.echo(f"package ok: digest sha256:{pkg.digest}" + (" (matches --digest)" if digest else ""))


@app.command()
def compare(
    device: Path = typer.Argument(..., help="The device package (e.g. an android build)."),
    server: str = typer.Argument(..., help="A server package folder (started here with edgekit serve, stopped "
                                 "after) or the URL of a running edgekit serve on this machine."),
    data: Path = typer.Option(..., "--data", help="The dataset both were built on: dev calibrates the cascade, "
                              "test is measured."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format."),
    out: Path = typer.Option(Path("compare"), help="Folder for compare.json, compare.md (the table) and the plots."),
    n: int = typer.Option(300, help="Test utterances timed one by one on each side."),
    load_seconds: float = typer.Option(20.0, help="Length of the `high` load test against the server."),
    record: bool = typer.Option(True, help="Write the chosen cascade threshold into the device manifest."),
):
    """Device and server side by side on the same utterances: size, accuracy, latency (device in process;
    server over loopback HTTP, alone and under load; plus modeled network round trips), and the device-first
    cascade with its threshold chosen on dev."""
    from rich.console import Console

    from edgekit import compare as cmp
    from edgekit.runtime import Package

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


@app.command(name="profile")
def profile_(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build`."),
    data: Path = typer.Option(..., "--data", help="Dataset whose test utterances are run."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format."),
    runtime: Optional[str] = typer.Option(None, help="executorch or onnx (default: the package's primary)."),
    n: int = typer.Option(200, help="Test utterances profiled (after 20 warm-up runs)."),
    threads: int = typer.Option(1, help="Runtime threads."),
    out: Path = typer.Option(Path("profile.json"), help="Where the hotspot table is written (JSON)."),
):
    """Per-op time of a package on its runtime: a hotspot table (op, runs per call, ms per call, share), saved in
    profile.json, and its top 10 added to the package's report.md."""
    from rich.console import Console

    from edgekit import profile as pf
    from edgekit.data import package_split
    from edgekit.io import write_json

    if n < 1 or threads < 1:
        raise EdgekitError("--n and --threads must be >= 1")
    texts = [ex.text for ex in package_split(data, package, "test", format)][:n]
    res = pf.profile(package, texts, _runtime(runtime, package) if runtime else None, threads)
    Console().print(pf.table(res, package))
    if res["note"]:
        typer.echo(f"note: {res['note']}", err=True)
    write_json(out, res)
    in_report = pf.add_to_report(package, res)
    typer.echo(f"written: {out}" + (f"; top 10 in {package / 'report.md'}" if in_report else ""))


@app.command()
def doctor(
    package: Optional[Path] = typer.Argument(None, help="A package folder to verify as well."),
):
    """Check this machine: versions, the ExecuTorch runtime and XNNPACK, ONNX Runtime's providers and the GPU,
    CPU features, disk and cache, the base model, and a package if given. Each problem comes with its fix; exit 1
    when something required is broken (docs/troubleshooting.md lists the errors users meet)."""
    from rich.console import Console

    from edgekit import doctor as dr
    from edgekit.runtime.package import package_dir

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


@app.command()
def targets():
    """List the device profiles in devices/."""
    from edgekit.targets import available, load_target

    for name in available():
        t = load_target(name)
        typer.echo(f"{name:12s} {', '.join(t.runtimes):18s} {t.description}")


def main() -> None:
    from edgekit.runtime.package import PackageError

    _quiet()
    try:
        app()
    except EdgekitError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except PackageError as e:  # a package that is not what the command needs (e.g. no model for --runtime)
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
