"""`edgekit build`: the stage registry and the run loop.

Each stage is `run(ctx) -> StageResult`, registered with `@stage(name)`. The loop resolves the settings, checks
every input, then for each stage computes its cache key: a matching entry is reused (the log and the report say
so, with the key), anything else runs and is stored. After each stage report.json and report.md are rewritten.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edgekit import __version__
from edgekit.build.cache import StageCache, default_dir, digest_files, stage_key
from edgekit.build.config import BuildConfig, resolve
from edgekit.build.context import RESULT_TYPES, Context, ModelResult, StageResult
from edgekit.data import check_trainable, load_dataset
from edgekit.errors import EdgekitError
from edgekit.io import write_json, write_text
from edgekit.model import base_config, default_base_model
from edgekit.report import render_markdown
from edgekit.vocab import from_wordpiece
from edgekit.wordpiece import WordPieceTokenizer

log = logging.getLogger("edgekit")
REGISTRY: dict[str, Callable[[Context], StageResult]] = {}
EXPORT_STAGES = ("export", "fuse", "package")  # their output depends on the target's runtimes
TOOLCHAIN = ("torch", "torchao", "executorch", "onnx", "onnxruntime")  # what quantize and the exporters run on


def stage(name: str):
    """Register `run(ctx) -> StageResult` as the stage `name`. A module may also define `attach(ctx, result)`,
    called on every result, made or reused (a lazy loader, or publishing files)."""
    def register(fn):
        REGISTRY[name] = fn
        return fn
    return register


def seed_everything(seed: int) -> None:
    """Seed every generator a stage may draw from, before it creates any module (fresh heads included)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def choose_max_len(tokenizer, texts: list[str], cap: int, bucket_percentiles: list[int] = ()) -> tuple[int, dict]:
    """p99 of piece counts ([CLS] and [SEP] included), rounded up to a multiple of 8, at most `cap`. Length
    buckets: the `bucket_percentiles` of piece counts rounded up the same way, those below max_len (SNIPS: p50
    12 -> 16, p90 19 -> 24 = max_len: buckets [16])."""
    lengths = np.array([tokenizer.length(t) for t in texts])
    p99 = float(np.percentile(lengths, 99))
    L = min(cap, max(8, int(math.ceil(p99 / 8)) * 8))
    buckets = {max(8, int(math.ceil(np.percentile(lengths, q) / 8)) * 8) for q in bucket_percentiles}
    return L, {"p50": float(np.percentile(lengths, 50)), "p99": p99, "max": int(lengths.max()),
               "truncated_share": float((lengths > L).mean()), "max_len": L,
               "buckets": sorted(b for b in buckets if b < L)}


def _data_files(path: str, out: str) -> list[Path]:
    """The files the data key digests: a folder's files, less OUT's when it sits inside (each build would change
    them, and the next would miss the cache)."""
    p, out_dir = Path(path), Path(out).resolve()
    return [p] if p.is_file() else sorted(x for x in p.rglob("*")
                                          if x.is_file() and not x.resolve().is_relative_to(out_dir))


def writable(folder: Path, flag: str) -> None:
    """Refuse, before any work, a folder that cannot take files (read-only, a file, no permission)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=folder).close()
    except OSError as e:
        raise EdgekitError(f"{flag} {folder}: cannot write there ({e.strerror or e})") from None


def prepare(cfg: BuildConfig) -> Context:
    """Resolve and check everything before any work: settings, target, data, base model, sequence length, OUT."""
    target, settings = resolve(cfg)
    if cfg.train_threads is not None and cfg.train_threads < 1:
        raise EdgekitError(f"train_threads must be >= 1, got {cfg.train_threads}")
    data = load_dataset(cfg.data, cfg.format, cfg.seed)
    check_trainable(data)  # refuse data that cannot train or be scored now, not after the first epoch
    base = Path(cfg.base_model) if cfg.base_model else default_base_model()
    hf = base_config(base)
    cache = StageCache(default_dir(cfg.cache))
    tokenizer, rows = from_wordpiece(WordPieceTokenizer.from_file(base / "vocab.txt").vocab,
                                     cache_dir=cache.root / "normalizer")
    texts = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    max_len, stats = choose_max_len(tokenizer, texts, hf["max_position_embeddings"], target.bucket_percentiles)
    pk = settings.package
    if pk.max_len:
        max_len = stats["max_len"] = pk.max_len
    # shorter fixed lengths for ExecuTorch; package.buckets overrides the profile's percentiles
    stats["buckets"] = sorted({b for b in (stats["buckets"] if pk.buckets is None else pk.buckets) if b < max_len})
    unknown = [i for i in cfg.intents or [] if i not in data.intents]
    if unknown:
        raise EdgekitError(f"--intents: unknown intent {unknown[0]!r}; {cfg.data} has: {', '.join(data.intents)}")
    base_files = [base / n for n in ("config.json", "model.safetensors", "vocab.txt")]
    writable(Path(cfg.out), "--out")  # refused now, not after training (an empty OUT may stay)
    digest = digest_files(_data_files(cfg.data, cfg.out) + base_files)
    ctx = Context(cfg, settings, target, data, Path(cfg.out), max_len, stats, tokenizer, rows, target.stages,
                  cache, digest, base_model=base)
    return ctx


def toolchain() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in TOOLCHAIN + ("onnxruntime-gpu",):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def key_of(ctx: Context, name: str, input_key: str) -> str:
    """The stage's cache key: its name, the settings it reads, the build facts it depends on, its input's key."""
    t = ctx.target
    facts = {"task": ctx.cfg.task, "seed": ctx.cfg.seed, "intents": ctx.cfg.intents, "format": ctx.data.format,
             "max_len": ctx.max_len}
    if name == "trim_vocab" and ctx.settings.compress.vocab_corpus:  # the file's content, not only its path
        facts["vocab_corpus"] = digest_files([Path(ctx.settings.compress.vocab_corpus)])
    if name in ("quantize",) + EXPORT_STAGES:
        facts["toolchain"] = toolchain()
    if name in EXPORT_STAGES:
        facts.update(runtimes=t.runtimes, primary=t.primary_runtime, buckets=ctx.length_stats["buckets"])
    if name == "package":  # measured on the profile's threads, and the manifest names the profile
        facts.update(threads=t.bench_threads, profile=t.name)
    return stage_key(name, {"settings": ctx.settings.read_by(name), "facts": facts}, input_key)


def _attach(ctx: Context, name: str, res: StageResult) -> None:
    hook = getattr(sys.modules[REGISTRY[name].__module__], "attach", None)
    if hook:
        hook(ctx, res)


def run_stage(ctx: Context, name: str, key: str, input_key: str) -> StageResult:
    """Reuse the stage's cache entry, or run it and store its result."""
    entry = ctx.cache.get(name, key)
    if entry is not None:
        try:
            res = RESULT_TYPES[name].load(entry.result, entry.path)
            res.key, res.reused = key, True
            log.info("stage %s: reused from the cache (key %s)", name, entry.short)
            return res
        except (TypeError, KeyError, ValueError) as e:  # an entry from another layout: make it again
            log.warning("cache entry %s/%s does not load (%s): rebuilding it", name, entry.short, e)
            ctx.cache.drop(name, key)
    log.info("stage %s (key %s)", name, key[:12])
    ctx.key, ctx.input_key = key, input_key
    seed_everything(ctx.cfg.seed)  # each stage starts from the same state, whichever stages ran before it
    ctx.work = ctx.cache.workdir(name)
    try:
        res = REGISTRY[name](ctx)
        res.save(ctx.work)
        entry = ctx.cache.put(name, key, ctx.work, res.to_json())
    except BaseException:
        shutil.rmtree(ctx.work, ignore_errors=True)
        raise
    finally:
        ctx.work = None
    res.key, res.dir = key, entry.path
    return res


def report(ctx: Context) -> dict:
    """report.json's content, from the typed results so far."""
    done = ctx.results()
    rows = []
    latency = ctx.package.latency if ctx.package else {}
    shipped = {rt: {k: lat[k] for k in ("p50_ms", "p99_ms")} for rt, lat in latency.items()}
    for name, res in done:
        row = dict(res.row, reused=res.reused, key=res.key)
        if name in ("fuse", "package") and shipped:
            row["latency"] = shipped
        elif name == "export" and shipped:  # as exported: ONNX before fusion
            row["latency"] = {rt: latency[rt].get("unfused", v) for rt, v in shipped.items()}
        rows.append(row)
    over = [r.record["extra"]["over_budget"] for _, r in done if r.record.get("extra", {}).get("over_budget")]
    quant = ctx.quantize.record["extra"].get("quant_layers") if ctx.quantize else None
    return {"edgekit": __version__, "task": ctx.cfg.task, "target": ctx.target.name,
            "dataset": {**ctx.data.summary(), "lengths": ctx.length_stats}, "stages": rows,
            "package": ctx.package.package if ctx.package else {}, "latency": latency,
            "config": {"settings": ctx.settings.to_dict(), "seed": ctx.cfg.seed, "stages": ctx.stages,
                       "intents": ctx.cfg.intents, "target": ctx.target.source, "cache": str(ctx.cache.root),
                       "strict": ctx.cfg.strict, "train_threads": _torch_threads()},
            "budget": {"intent_drop_pts": ctx.settings.budget.intent_drop_pts,
                       "slot_f1_drop_pts": ctx.settings.budget.slot_f1_drop_pts},
            "over_budget": over or None, "quant_layers": quant, "passes": [r.record for _, r in done]}


def _plots_listed(out: Path) -> list[str]:
    """The plot files an earlier build's report.json in OUT/ lists (edgekit's own, so a rebuild may remove them)."""
    try:
        plots = json.loads((out / "report.json").read_text()).get("plots") or {}
        return [v for v in plots.values() if isinstance(v, str)]
    except (OSError, ValueError, AttributeError):
        return []


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def build(cfg: BuildConfig, on_stage=None) -> dict:
    """Run (or reuse) the stages; returns report.json's content. `on_stage(name, row)` after each stage."""
    import torch

    import edgekit.build.stages  # noqa: F401  (the stages register on import)
    from edgekit.perf import tune_allocator

    tune_allocator()
    ctx = prepare(cfg)  # every setting checked before any work or output
    before = torch.get_num_threads()  # torch's default: the physical cores, or $OMP_NUM_THREADS
    # Training runs on cfg.train_threads (default: torch's); latency is measured on the profile's threads (below).
    torch.set_num_threads(cfg.train_threads or before)
    try:
        return _run(ctx, on_stage)
    finally:
        torch.set_num_threads(before)  # a library caller gets its own setting back


def _run(ctx: Context, on_stage) -> dict:
    from edgekit.build.gating import BudgetMissed
    from edgekit.runtime.backends import set_threads

    cfg = ctx.cfg
    old_plots = _plots_listed(ctx.out)  # read before the first stage rewrites report.json
    log.info("training on %d threads", _torch_threads())
    # XNNPACK's pool size can only be set before the first program loads; latency is measured on it.
    set_threads(ctx.target.bench_threads)
    out_key = ctx.input_digest  # what the next stage's key builds on: the previous stage's output
    for name in ctx.stages:
        t0 = time.perf_counter()
        key = key_of(ctx, name, out_key)
        try:
            res = run_stage(ctx, name, key, out_key)
        except ValueError as e:  # a pass setting that cannot hold for this data (e.g. a budget below its floor)
            raise EdgekitError(f"stage {name}: {e}") from None
        setattr(ctx, name, res)
        out_key = res.out_key or res.key
        _attach(ctx, name, res)
        rep = report(ctx)
        ctx.out.mkdir(parents=True, exist_ok=True)
        write_json(ctx.out / "report.json", rep)
        write_text(ctx.out / "report.md", render_markdown(rep))
        over = res.record.get("extra", {}).get("over_budget")
        if over and cfg.strict:
            raise BudgetMissed(over["message"] + "; --strict: no package written. Every try is in the cache: loosen "
                               "the budget (--set budget.intent_drop_pts=...) or compress less")
        if on_stage:
            on_stage(name, dict(res.row, reused=res.reused, key=key[:12], wall=time.perf_counter() - t0))
    for name, res in ctx.results():  # free the models: the report is what the caller gets
        if isinstance(res, ModelResult):
            res._model = None
    from edgekit.plots import PLOTS, write_plots

    rep = report(ctx)
    rep["plots"] = write_plots(rep, ctx.out)
    for name in set(old_plots) & set(PLOTS.values()) - set(rep["plots"].values()):  # an old build's, not drawn now
        (ctx.out / name).unlink(missing_ok=True)
    write_json(ctx.out / "report.json", rep)
    write_text(ctx.out / "report.md", render_markdown(rep))
    return rep
