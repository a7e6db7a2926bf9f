"""`edgekit build`: named stages run in order, each saving a checkpoint and appending a report record.

Stages (this version): teacher -> export -> package. Later passes slot in between teacher and export.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit import __version__
from edgekit.data import Dataset, load_dataset
from edgekit.errors import EdgekitError
from edgekit.io import write_json, write_text
from edgekit.model import (
    JointModel,
    count_params,
    default_base_model,
    gather_embeddings,
    load_model,
    load_pretrained,
    save_model,
)
from edgekit.record import PassRecord
from edgekit.report import render_markdown
from edgekit.runtime.package import MANIFEST, SCHEMA_VERSION, Package, sha256
from edgekit.runtime.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from edgekit.targets import Target, load_target
from edgekit.training import TrainConfig, agreement, labels_of, predict_eager, score, train_teacher
from edgekit.vocab import from_wordpiece

log = logging.getLogger("edgekit")

STAGES = ("teacher", "export", "package")
MODEL_FILES = {"executorch": "model.pte", "onnx": "model.onnx"}
CHECKPOINTS = "checkpoints"
STATE = "state.json"


@dataclass
class BuildConfig:
    """Everything `edgekit build` needs; the CLI only maps its options onto these fields."""

    data: str
    out: str
    task: str = "intent"
    target: str = "android"
    format: str | None = None
    base_model: str | None = None
    seed: int = 0
    resume: bool = False
    max_len: int | None = None  # default: p99 of piece lengths on train+dev, rounded up to a multiple of 8
    bench_utterances: int = 200
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        if self.task != "intent":
            raise EdgekitError(f"unknown --task {self.task!r}; supported: intent")
        if self.max_len is not None and not 8 <= self.max_len <= 512:
            raise EdgekitError(f"--max-len must be in 8..512, got {self.max_len}")


def choose_max_len(tokenizer, texts: list[str], cap: int) -> tuple[int, dict]:
    """p99 of piece counts ([CLS] and [SEP] included), rounded up to a multiple of 8, at most `cap`."""
    lengths = np.array([tokenizer.length(t) for t in texts])
    p99 = float(np.percentile(lengths, 99))
    L = min(cap, max(8, int(math.ceil(p99 / 8)) * 8))
    return L, {"p50": float(np.percentile(lengths, 50)), "p99": p99, "max": int(lengths.max()),
               "truncated_share": float((lengths > L).mean()), "max_len": L}


@dataclass
class Context:
    cfg: BuildConfig
    target: Target
    data: Dataset
    tokenizer: SentencePieceTokenizer
    out: Path
    max_len: int
    length_stats: dict
    base_rows: list[int] = field(default_factory=list)  # base WordPiece row per teacher SentencePiece id
    model: JointModel | None = None
    records: list[dict] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    latency: dict = field(default_factory=dict)
    package: dict = field(default_factory=dict)

    @property
    def labels(self) -> dict:
        return labels_of(self.data)

    @property
    def ckpt_dir(self) -> Path:
        return self.out / CHECKPOINTS

    def stage_row(self, name: str, metrics: dict, params: int, size_bytes: int, seconds: float) -> dict:
        keys = ("intent_acc", "slot_f1", "exact_match", "in_scope_acc", "oos_recall")
        row = {"name": name, **{k: metrics.get(k) for k in keys if k in metrics}}
        row.update(params=params, size_bytes=size_bytes, seconds=round(seconds, 2))
        return row


def _base_model_dir(cfg: BuildConfig) -> Path:
    return Path(cfg.base_model) if cfg.base_model else default_base_model()


def stage_teacher(ctx: Context) -> tuple[dict, PassRecord]:
    model = load_pretrained(_base_model_dir(ctx.cfg), len(ctx.data.intents), len(ctx.data.slot_tags))
    gather_embeddings(model, ctx.base_rows)  # WordPiece rows -> the teacher's SentencePiece ids
    model, rec = train_teacher(model, ctx.data, ctx.tokenizer, ctx.cfg.train)
    ctx.model = model
    save_model(model, ctx.ckpt_dir / "teacher.safetensors")
    t1 = time.perf_counter()
    test = ctx.data.splits["test"]
    rec.metrics = score(test, predict_eager(model, test, ctx.tokenizer, ctx.labels, ctx.max_len), ctx.labels)
    rec.seconds += time.perf_counter() - t1
    return ctx.stage_row("teacher", rec.metrics, count_params(model), rec.bytes_after, rec.seconds), rec


def _check_inputs(ctx: Context, n: int = 64) -> list[tuple[np.ndarray, np.ndarray]]:
    encs = [ctx.tokenizer.encode(ex.text, ctx.max_len) for ex in ctx.data.splits["test"][:n]]
    return [(np.asarray([e.input_ids], dtype=np.int64), np.asarray([e.attention_mask], dtype=np.int64))
            for e in encs]


def _runtime_answers(ctx: Context, runtime: str, path: Path) -> list[dict]:
    from edgekit.runtime.backends import BACKENDS
    from edgekit.runtime.predictor import Predictor

    p = Predictor(BACKENDS[runtime](path), ctx.tokenizer, ctx.labels, ctx.max_len)
    return [p.predict(ex.text, warn=False) for ex in ctx.data.splits["test"]]


def stage_export(ctx: Context) -> tuple[dict, PassRecord]:
    """Export each of the target's runtimes, check vs eager, then score every artifact on the whole test split."""
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx

    t0 = time.perf_counter()
    exporters = {"executorch": (export_executorch, ExecuTorchExportConfig(ctx.max_len)),
                 "onnx": (export_onnx, OnnxExportConfig(ctx.max_len))}
    checks = _check_inputs(ctx)
    test = ctx.data.splits["test"]
    eager = predict_eager(ctx.model, test, ctx.tokenizer, ctx.labels, ctx.max_len)
    rec = PassRecord("export", params_before=count_params(ctx.model), params_after=count_params(ctx.model))
    for runtime in ctx.target.runtimes:
        fn, ecfg = exporters[runtime]
        path = ctx.out / MODEL_FILES[runtime]
        r = fn(ctx.model, ecfg, path, checks)
        answers = _runtime_answers(ctx, runtime, path)
        r.metrics = score(test, answers, ctx.labels)
        r.extra["agreement_with_eager"] = agreement(answers, eager)
        rec.extra[runtime] = r.to_dict()
        rec.warnings += r.warnings
        log.info("%s: %s bytes, agreement with eager %.4f, max abs diff %.2e", runtime, r.bytes_after,
                 r.extra["agreement_with_eager"], r.extra["parity"]["max_abs_diff"])
    primary = rec.extra[ctx.target.primary_runtime]
    rec.metrics, rec.bytes_after = primary["metrics"], primary["bytes_after"]
    rec.seconds = time.perf_counter() - t0
    row = ctx.stage_row("export", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return row, rec


def stage_package(ctx: Context) -> tuple[dict, PassRecord]:
    """Write tokenizer, labels and manifest; reload the package as an app would; measure it."""
    from edgekit.runtime.predictor import Predictor

    t0 = time.perf_counter()
    ctx.tokenizer.save(ctx.out / "tokenizer.model")
    write_json(ctx.out / "labels.json", ctx.labels)
    files = ["tokenizer.model", "labels.json"] + [MODEL_FILES[r] for r in ctx.target.runtimes]
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created_by": f"edgekit {__version__}",
        "task": ctx.cfg.task,
        "profile": ctx.target.name,
        "max_len": ctx.max_len,
        # BERT's basic pre-tokenizer (clean, lowercase, strip accents, split punctuation) runs before SentencePiece.
        "tokenizer": {"type": "sentencepiece", "file": "tokenizer.model", "pretokenizer": "bert_basic",
                      "lowercase": ctx.tokenizer.lowercase, "vocab_size": ctx.tokenizer.vocab_size},
        "labels": "labels.json",
        "label_sets": {"intents": len(ctx.data.intents), "slot_tags": len(ctx.data.slot_tags)},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, ctx.max_len]},
                   {"name": "attention_mask", "dtype": "int64", "shape": [1, ctx.max_len]}],
        "outputs": ["intent_logits"] + (["slot_logits"] if ctx.data.has_slots else []),
        "models": {r: MODEL_FILES[r] for r in ctx.target.runtimes},
        "primary_runtime": ctx.target.primary_runtime,
        "files": {f: {"sha256": sha256(ctx.out / f), "bytes": (ctx.out / f).stat().st_size} for f in files},
    }
    write_json(ctx.out / MANIFEST, manifest)
    pkg = Package.load(ctx.out)
    sizes = {f: m["bytes"] for f, m in manifest["files"].items()}
    sizes[MANIFEST] = (ctx.out / MANIFEST).stat().st_size
    shared = sum(b for f, b in sizes.items() if f not in MODEL_FILES.values())
    per_runtime = {r: shared + sizes[MODEL_FILES[r]] for r in ctx.target.runtimes}
    ctx.package = {"size_bytes": per_runtime[ctx.target.primary_runtime], "runtime": ctx.target.primary_runtime,
                   "size_bytes_per_runtime": per_runtime, "files": sizes}
    texts = [ex.text for ex in ctx.data.splits["test"][: ctx.cfg.bench_utterances]]
    rec = PassRecord("package", params_after=count_params(ctx.model), bytes_after=ctx.package["size_bytes"])
    for runtime in ctx.target.runtimes:
        p = Predictor.open(pkg, runtime, threads=ctx.target.bench_threads)
        lat = p.latency(texts)
        ctx.latency[runtime] = {"p50_ms": round(lat["p50_ms"], 3), "p99_ms": round(lat["p99_ms"], 3),
                                "threads": ctx.target.bench_threads, "n": lat["n"], "max_len": ctx.max_len}
        if runtime == ctx.target.primary_runtime:
            test = ctx.data.splits["test"]
            rec.metrics = score(test, [p.predict(ex.text, warn=False) for ex in test], ctx.labels)
    rec.extra = {"latency": ctx.latency, "package": ctx.package}
    rec.seconds = time.perf_counter() - t0
    row = ctx.stage_row("package", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return row, rec


STAGE_FUNCS = {"teacher": stage_teacher, "export": stage_export, "package": stage_package}


def report(ctx: Context, rows: list[dict]) -> dict:
    return {"edgekit": __version__, "task": ctx.cfg.task, "target": ctx.target.name,
            "dataset": {**ctx.data.summary(), "lengths": ctx.length_stats}, "stages": rows,
            "package": ctx.package, "latency": ctx.latency,
            "passes": ctx.records}


def _save_state(ctx: Context, rows: list[dict]) -> None:
    write_json(ctx.ckpt_dir / STATE, {"done": ctx.done, "rows": rows, "records": ctx.records,
                                      "latency": ctx.latency, "package": ctx.package, "max_len": ctx.max_len,
                                      "model": "teacher.safetensors", "data": ctx.cfg.data})


def prepare(cfg: BuildConfig) -> Context:
    """Check every input before any work: target, data, base model, tokenizer, sequence length."""
    target = load_target(cfg.target)
    data = load_dataset(cfg.data, cfg.format, cfg.seed)
    base = _base_model_dir(cfg)
    if not (base / "vocab.txt").is_file():
        raise EdgekitError(f"{base / 'vocab.txt'}: missing; the base model folder needs a WordPiece vocab.txt")
    tokenizer, rows = from_wordpiece(WordPieceTokenizer.from_file(base / "vocab.txt").vocab)
    texts = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    hf = json.loads((base / "config.json").read_text()) if (base / "config.json").is_file() else {}
    max_len, stats = choose_max_len(tokenizer, texts, hf.get("max_position_embeddings", 512))
    if cfg.max_len:
        max_len = stats["max_len"] = cfg.max_len
    return Context(cfg, target, data, tokenizer, Path(cfg.out), max_len, stats, base_rows=rows)


def build(cfg: BuildConfig, on_stage=None) -> dict:
    """Run the stages; returns report.json's content. `on_stage(name, row)` is called after each stage."""
    from edgekit.runtime.backends import set_threads

    ctx = prepare(cfg)
    ctx.out.mkdir(parents=True, exist_ok=True)
    # XNNPACK's pool size can only be set before the first program loads; latency is measured on it.
    set_threads(ctx.target.bench_threads)
    rows: list[dict] = []
    state_file = ctx.ckpt_dir / STATE
    if cfg.resume and state_file.is_file():
        state = json.loads(state_file.read_text())
        if state.get("max_len") != ctx.max_len:
            raise EdgekitError(f"{state_file}: built with max_len {state.get('max_len')}, now {ctx.max_len}; "
                               "rerun without --resume")
        ctx.done, rows, ctx.records = state["done"], state["rows"], state["records"]
        ctx.latency, ctx.package = state.get("latency", {}), state.get("package", {})
        if ctx.done:
            ctx.model = load_model(ctx.ckpt_dir / state["model"])
        log.info("resuming after stages: %s", ", ".join(ctx.done) or "none")
    elif not cfg.resume and ctx.ckpt_dir.exists():
        shutil.rmtree(ctx.ckpt_dir)
    for name in STAGES:
        if name in ctx.done:
            continue
        log.info("stage %s", name)
        row, rec = STAGE_FUNCS[name](ctx)
        rows.append(row)
        ctx.records.append(rec.to_dict())
        ctx.done.append(name)
        _save_state(ctx, rows)
        rep = report(ctx, rows)
        write_json(ctx.out / "report.json", rep)
        write_text(ctx.out / "report.md", render_markdown(rep))
        if on_stage:
            on_stage(name, row)
    return report(ctx, rows)
