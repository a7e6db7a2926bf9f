"""The `edgekit` command. Thin: options map onto config fields; errors become one line and exit code 2."""

from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Optional

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
    data: Path = typer.Option(..., "--data", help="Dataset: JointBERT folder, CLINC150 JSON, CSV or JSONL."),
    out: Path = typer.Option(..., "--out", help="Output folder: the package, report.json and report.md."),
    task: str = typer.Option("intent", help="Task (intent: intent + slots when the data has slots)."),
    target: str = typer.Option("android", help="Device profile from devices/*.toml (android, ios, server-gpu)."),
    format: Optional[str] = typer.Option(None, "--format", help="Force the data format: jointbert|clinc|csv|jsonl."),
    base_model: Optional[Path] = typer.Option(None, help="Local BERT-family folder (default: all-MiniLM-L6-v2)."),
    epochs: int = typer.Option(5, help="Teacher fine-tuning epochs."),
    batch_size: int = typer.Option(32, help="Teacher batch size."),
    lr: float = typer.Option(1e-4, help="Encoder learning rate (heads use 10x)."),
    max_len: Optional[int] = typer.Option(None, help="Fixed sequence length (default: p99 of the data, /8)."),
    buckets: Optional[str] = typer.Option(None, help="Shorter fixed lengths exported beside --max-len as "
                                          "ExecuTorch methods, e.g. 16 or 16,24; 'none' for one length "
                                          "(default: p50 and p90 of the data, /8)."),
    max_minutes: Optional[float] = typer.Option(None, help="Stop teacher training after this many minutes."),
    steps_limit: Optional[int] = typer.Option(None, help="Cap optimizer steps per epoch (quick runs)."),
    seed: int = typer.Option(0, help="Seed for splits, initialisation and shuffling."),
    resume: bool = typer.Option(False, help="Continue after the last completed stage in OUT/checkpoints."),
    stages: Optional[str] = typer.Option(None, help="Comma-separated stages (default: the target's), e.g. "
                                         "teacher,export,package to skip compression."),
    vocab_budget: Optional[int] = typer.Option(None, help="Most vocabulary pieces (0: all task pieces)."),
    vocab_corpus: Optional[Path] = typer.Option(None, help="Extra text (one utterance per line) whose pieces the "
                                                "trimmed vocabulary keeps."),
    param_share: Optional[float] = typer.Option(None, help="Non-embedding parameters kept by pruning, as a share "
                                                "of the teacher's (android: 0.25)."),
    prune_layers: Optional[int] = typer.Option(None, help="Whole layers removed by pruning (android: 2)."),
    distill_epochs: Optional[int] = typer.Option(None, help="Distillation epochs."),
    distill_augment: Optional[float] = typer.Option(None, help="Slot-swapped extra utterances for distillation, as "
                                                    "a share of train (android: see devices/android.toml)."),
    distill_novel: Optional[float] = typer.Option(None, help="Share of swapped open-class slot values made of "
                                                  "words unseen in the data (split into pieces by the student)."),
    word_pool: Optional[bool] = typer.Option(None, "--word-pool/--no-word-pool", help="The student's slot head "
                                             "reads the mean of each word's pieces (android, ios: on)."),
    temperature: Optional[float] = typer.Option(None, help="Distillation temperature T."),
    alpha: Optional[float] = typer.Option(None, help="Weight of the teacher's soft targets (1 - alpha: gold)."),
    max_retries: Optional[int] = typer.Option(None, help="Gate back-offs before the build stops."),
    intents: Optional[str] = typer.Option(None, help="Comma-separated intents the package may answer (baked into "
                                          "the graph; default: all)."),
    oos_far: float = typer.Option(0.05, help="Without out-of-scope data: share of held-out in-scope utterances the "
                                  "rejection threshold may reject."),
    keep_fp32: Optional[list[str]] = typer.Option(None, "--keep-fp32", help="Linear layers kept FP32 by the "
                                                  "quantize stage (fnmatch pattern, e.g. 'layers.0.*'; repeatable)."),
    calib_samples: Optional[int] = typer.Option(None, help="Utterances INT8 activation ranges are calibrated on."),
    calib_method: Optional[str] = typer.Option(None, help="ONNX Runtime calibration: minmax, percentile, entropy."),
    embedding_bits: Optional[int] = typer.Option(None, help="Word-embedding precision in the ExecuTorch package: "
                                                 "4, 8 or 0 (FP32)."),
):
    """Fine-tune a teacher, export it for the target's runtimes, and write a verified package."""
    from edgekit.pipeline import BuildConfig
    from edgekit.pipeline import build as run_build
    from edgekit.training import TrainConfig

    # torch configures its own loggers on import; only its errors belong on the build's terminal.
    logging.getLogger("torch").setLevel(logging.ERROR)
    try:
        train = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, head_lr=min(0.5, lr * 10), seed=seed,
                            max_minutes=max_minutes, steps_limit=steps_limit)
    except ValueError as e:
        raise EdgekitError(str(e)) from None
    cfg = BuildConfig(data=str(data), out=str(out), task=task, target=target, format=format,
                      base_model=str(base_model) if base_model else None, seed=seed, resume=resume,
                      max_len=max_len, buckets=_lengths(buckets), train=train, stages=stages.split(",") if stages else None,
                      vocab_corpus=str(vocab_corpus) if vocab_corpus else None, intents=_names(intents),
                      oos_far=oos_far,
                      compress={"vocab_budget": vocab_budget, "param_share": param_share, "prune_layers": prune_layers,
                                "distill_epochs": distill_epochs, "distill_augment": distill_augment,
                                "distill_novel": distill_novel, "word_pool": word_pool,
                                "temperature": temperature, "alpha": alpha, "max_retries": max_retries},
                      quantize={k: v for k, v in {"keep_fp32": keep_fp32, "calib_samples": calib_samples,
                                                  "method": calib_method, "embedding_bits": embedding_bits}.items()
                                if v is not None})

    def show(name, row):
        figs = ", ".join(f"{k} {row[k]:.4f}" for k in ("intent_acc", "slot_f1", "exact_match", "in_scope_acc",
                                                       "oos_recall") if row.get(k) is not None)
        typer.echo(f"[{name}] {figs}, {row['params']:,} params, {row['size_bytes']:,} bytes, {row['seconds']:.1f}s",
                   err=True)

    rep = run_build(cfg, on_stage=show)
    lat = ", ".join(f"{k} p50 {v['p50_ms']:.2f} ms" for k, v in rep["latency"].items())
    typer.echo(f"package: {out} ({rep['package']['size_bytes']:,} bytes for {rep['package']['runtime']}); {lat}")
    typer.echo(f"report: {out / 'report.md'}")


def _names(csv: str | None) -> list[str] | None:
    return [x.strip() for x in csv.split(",") if x.strip()] if csv is not None else None


def _lengths(csv: str | None) -> list[int] | None:
    """--buckets: 'none' -> [] (one length), '16,24' -> [16, 24], unset -> None (the profile's choice)."""
    if csv is None:
        return None
    if csv.strip().lower() == "none":
        return []
    try:
        return [int(x) for x in _names(csv)]
    except ValueError:
        raise EdgekitError(f"--buckets: expected lengths like 16,24 or 'none', got {csv!r}") from None


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
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
