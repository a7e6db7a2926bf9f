"""The commands that use a built package: predict, eval, bench, verify and profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.cli.options import (
    AllowIntents,
    Format,
    HeldOutSplit,
    NoReject,
    Package,
    Provider,
    Runtime,
    check_counts,
    check_providers,
    command,
    names,
    runtime_of,
)
from edgekit.errors import EdgekitError


@command()
def predict(
    package: Package,
    text: Annotated[str, typer.Argument(help="The utterance.")],
    runtime: Runtime = None,
    tags: Annotated[bool, typer.Option(help="Also print the per-word BIO tags.")] = False,
    allow_intents: AllowIntents = None,
    no_reject: NoReject = False,
    fallback: Annotated[Optional[str], typer.Option(
        help="An `edgekit serve` URL asked when the device is unsure (its cascade.score, path_confidence or "
             "confidence, below the manifest's cascade.threshold, or --escalate-below; never for a text that says "
             "nothing).")] = None,
    escalate_below: Annotated[Optional[float], typer.Option(help="With --fallback: the score below which the "
                                                            "server answers.")] = None,
):
    """Answer one utterance with a package, as JSON.

    The answer has the intent, its confidence, the slots and (with slots) path_confidence, the whole answer's; with
    --fallback also `escalated`, and `fallback` when the server could not answer in time."""
    from edgekit.runtime import Predictor
    from edgekit.runtime.tokenizer import InputError

    if escalate_below is not None and fallback is None:
        raise EdgekitError("--escalate-below: needs --fallback URL, the server it escalates to")
    try:  # a bad package is one `error:` line and exit 2 (main)
        pred = Predictor.open(package, runtime_of(runtime, package), fallback_url=fallback,
                              escalate_below=escalate_below)
    except ValueError as e:  # the API names its parameters; the user typed the flags
        msg = str(e)
        raise EdgekitError(f"--escalate-below{msg.removeprefix('escalate_below')}" if msg.startswith("escalate_below:")
                           else f"--fallback: {msg}") from None
    try:
        result = pred.predict(text, allow_intents=names(allow_intents), reject=not no_reject)
    except InputError as e:  # e.g. bytes that are not UTF-8 on the command line
        raise EdgekitError(f"text: {e}") from None
    except ValueError as e:  # the API names its parameter; the user typed the flag
        raise EdgekitError(f"--allow-intents: {str(e).removeprefix('allow_intents: ')}") from None
    if not tags:
        result.pop("tags", None)
    typer.echo(json.dumps(result, ensure_ascii=False))


@command("eval")
def eval_(
    package: Package,
    data: Annotated[Path, typer.Option("--data", help="Dataset with the split to score.")],
    runtime: Runtime = None,
    split: HeldOutSplit = "test",
    format: Format = None,
    compare_eager: Annotated[bool, typer.Option(help="Also report agreement with the eager model, if "
                                                "checkpointed.")] = True,
    allow_intents: AllowIntents = None,
    no_reject: NoReject = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="A folder for the evaluation's files: eval.json (this JSON), errors.jsonl (the answers not "
        "an exact match, confident mistakes first), confusion.png, labels.md. Never the package folder.")] = None,
):
    """Score a package by running it (tokenizer, runtime, decoder) on every utterance of a split.

    The JSON has the overall figures and, under by_label, each intent's and slot type's precision, recall, F1 and
    support, and the intents' confusion counts. With --out it is written to files, and one line says which."""
    from edgekit.tools.package_eval import evaluate_package

    res = evaluate_package(package, data, runtime_of(runtime, package), split, format, compare_eager,
                           names(allow_intents), not no_reject, out)
    if out is None:
        typer.echo(json.dumps(res, indent=2))
        return
    w = res["written"]
    typer.echo(f"written: {w['eval']}, {w['errors']} ({w['errors_count']} answers not an exact match), "
               f"{w['confusion']}, {w['labels']}")


@command("bench")
def bench_(
    package: Package,
    data: Annotated[Path, typer.Option("--data", help="Dataset whose utterances are timed.")],
    format: Format = None,
    runtime: Runtime = None,
    n: Annotated[int, typer.Option(help="Utterances timed (each 3 times).")] = 200,
    threads: Annotated[int, typer.Option(help="Runtime threads (1: as an app's foreground call).")] = 1,
    compare_teacher: Annotated[bool, typer.Option(help="Also export the build's FP32 teacher the same way and time "
                                                  "it in the same run; reports the speed-up.")] = False,
    split: HeldOutSplit = "test",
    batch: Annotated[Optional[str], typer.Option(help="Batch sizes, e.g. 1,8,32,128: throughput of a server "
                                                 "package's batched graph at each (ONNX Runtime).")] = None,
    provider: Provider = None,
):
    """Time a package's model call on real utterances (p50/p99 after warm-up).

    With --batch, a server package's throughput by batch size."""
    from edgekit.data.dataset import package_split
    from edgekit.tools.bench import batch_throughput, bench

    check_counts(n=n, threads=threads)
    check_providers(provider)
    if batch is None:
        rt = runtime_of(runtime, package)
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


@command()
def verify(
    package: Package,
    digest: Annotated[Optional[str], typer.Option(help="The package digest you tested (sha256 of manifest.json, as "
                                                  "`edgekit build` prints it); any other package is refused.")] = None,
):
    """Check a package's files without loading a model.

    The manifest's schema, every file listed and inside the folder with its sha256 and size, no stray files, and
    with --digest the manifest itself. One line per file; exit 2 on any failure."""
    from edgekit.runtime.package import Package as Pkg

    pkg = Pkg.load(package, digest=digest)  # a failure is one `error:` line and exit 2 (main)
    for name, meta in pkg.manifest["files"].items():
        typer.echo(f"ok  {name}  sha256:{meta['sha256'][:16]}…  {meta['bytes']:,} bytes")
    pkg.check_strays()
    typer.echo(f"package ok: digest sha256:{pkg.digest}" + (" (matches --digest)" if digest else ""))


@command("profile")
def profile_(
    package: Package,
    data: Annotated[Path, typer.Option("--data", help="Dataset whose test utterances are run.")],
    format: Format = None,
    runtime: Runtime = None,
    n: Annotated[int, typer.Option(help="Test utterances profiled (after 20 warm-up runs).")] = 200,
    threads: Annotated[int, typer.Option(help="Runtime threads.")] = 1,
    out: Annotated[Path, typer.Option(help="Where the hotspot table is written (JSON).")] = Path("profile.json"),
):
    """Time each op of a package on its runtime: a hotspot table.

    The table (op, runs per call, ms per call, share) is saved in profile.json, and its top 10 added to the
    package's report.md."""
    from rich.console import Console

    from edgekit.data.dataset import package_split
    from edgekit.io import write_json
    from edgekit.tools import profiler as pf

    check_counts(n=n, threads=threads)
    texts = [ex.text for ex in package_split(data, package, "test", format)][:n]
    res = pf.profile(package, texts, runtime_of(runtime, package) if runtime else None, threads)
    Console().print(pf.table(res, package))
    if res["note"]:
        typer.echo(f"note: {res['note']}", err=True)
    write_json(out, res)
    in_report = pf.add_to_report(package, res)
    typer.echo(f"written: {out}" + (f"; top 10 in {package / 'report.md'}" if in_report else ""))
