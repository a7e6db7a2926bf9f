"""`edgekit build`: set up (prepare), then one pass down the stages.

For each stage of the build (edgekit.engine.registry gives the order and what each reads) the runner computes
its cache key (edgekit.engine.keys): a matching entry is reused (the log and the report say so, with the key),
anything else runs and is stored. After each stage report.json and report.md are rewritten
(edgekit.engine.report).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path

from edgekit.data.check import Lengths, check_dataset, choose_max_len, summary
from edgekit.data.dataset import check_trainable, load_dataset, unlabelled_pool
from edgekit.engine import registry, search
from edgekit.engine.cache import StageCache, default_dir
from edgekit.engine.config import BuildConfig, resolve
from edgekit.engine.context import Context
from edgekit.engine.keys import input_digest, key_of
from edgekit.engine.report import LABEL_ISSUES, finish, plots_listed, report, torch_threads, write
from edgekit.engine.results import ModelResult, StageResult, TeacherResult, result_type
from edgekit.errors import EdgekitError
from edgekit.modeling.pretrained import base_config, base_folder, max_positions, specials
from edgekit.text.vocab import from_wordpiece
from edgekit.text.wordpiece import WordPieceTokenizer

log = logging.getLogger("edgekit")


def data_check(data, tokenizer, max_len: int, strict: bool) -> dict:
    """The check `edgekit data check` runs, on the data as this build reads it, with its tokenizer and max_len:
    its summary for report.json. With --strict-data any finding refuses the build here, before any training."""
    findings = check_dataset(data, lengths=Lengths(max_len, tokenizer.length))
    if findings and strict:
        f = findings[0]
        raise EdgekitError(f"--strict-data: {len(findings):,} data finding{'s' * (len(findings) != 1)} in "
                           f"{data.source}; first: {f.where}: {f.kind}: {f.message} (edgekit data check "
                           f"{data.source} lists them all)")
    rep = summary(findings)
    if findings:
        log.warning("data check: %s (report.json data_check; edgekit data check %s lists them all)",
                    ", ".join(f"{n} {k}" for k, n in rep["counts"].items()), data.source)
    return rep


def label_issues(ctx: Context) -> dict:
    """--label-issues: the label-issue search (edgekit.data.label_issues) on the build's data; its rows in
    OUT/label_issues.jsonl, its summary for report.json."""
    from edgekit.data.label_issues import LabelIssuesConfig, find_label_issues, write_label_issues

    # the build's own base model (--base-model, else the profile's): its features judge the labels
    cfg = LabelIssuesConfig(base_model=str(ctx.base_model)) if ctx.base_model else LabelIssuesConfig()
    result = find_label_issues(ctx.data, cfg, cache_dir=ctx.cache.root, progress=True)
    write_label_issues(result, ctx.out / LABEL_ISSUES)
    return {**result["summary"], "file": LABEL_ISSUES}


def writable(folder: Path, flag: str) -> None:
    """Refuse, before any work, a folder that cannot take files (read-only, a file, no permission)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=folder).close()
    except OSError as e:
        raise EdgekitError(f"{flag} {folder}: cannot write there ({e.strerror or e})") from None


def _base(cfg: BuildConfig, target, cache: StageCache) -> tuple[BuildConfig, Path]:
    """The build's base model: --base-model, else the profile's `base_model` (the server profiles': all-mpnet-base-v2),
    else minilm. cfg comes back naming it, and its folder with it."""
    if cfg.base_model is not None or target.base_model is None:
        return cfg, base_folder(cfg.base_model, cache.root / "models")
    try:
        return dataclasses.replace(cfg, base_model=target.base_model), base_folder(target.base_model,
                                                                                 cache.root / "models")
    except EdgekitError as e:  # its extra is missing: say where the choice came from, and the other way
        if not str(e).startswith("--base-model"):
            raise
        raise EdgekitError(f"{e}; --target {target.name} builds it unless --base-model says otherwise "
                           f"({target.source}): --base-model minilm builds the small one") from None


# What a manifest holds besides the intent names it may list (decoding.allowed_intents, oos_answer): a real one is
# 2-3 KB, the files' sha256 included. Counted generously: the estimate must never be below the manifest written.
MANIFEST_REST = 64 << 10
# tokenizer.model's top-level fields besides its pieces (SentencePiece's ModelProto: trainer_spec, normalizer_spec,
# self_test_data, denormalizer_spec); the runtime walks at most protofile.MAX_FIELDS fields of one message.
SP_OTHER_FIELDS = 4
# What each bound of package_limits counts, the manifest field the runtime checks it on, and what to do about it.
LIMITED = {"intents": ("intents", "label_sets.intents", "merge or drop intents"),
           "slot_tags": ("slot tags", "label_sets.slot_tags", "merge or drop slot names"),
           "pieces": ("pieces in the base model's vocabulary", "tokenizer.vocab_size and tokenizer.model's fields",
                      "trim it (a profile with the trim_vocab stage) or choose another --base-model"),
           "max_len": ("pieces of sequence length (p99 of train and dev)", "max_len",
                       "set package.max_len, or shorten the utterances"),
           "bucket": ("pieces of a length bucket", "buckets.executorch max_len", "change package.buckets")}


def package_limits() -> dict:
    """The limits the runtime holds a package to that the data (or the base model) decides, read from their
    owners: the JSON files' byte limits (edgekit.runtime.jsonfile), the manifest schema's bounds as (least, most),
    and the pieces a tokenizer.model may hold (edgekit.runtime.protofile walks at most MAX_FIELDS fields)."""
    from edgekit.runtime import jsonfile, protofile
    from edgekit.runtime.package import SCHEMA_PATH, schema

    props = schema(SCHEMA_PATH)["properties"]

    def bounds(node: dict) -> tuple[int, float]:
        return node.get("minimum", 0), node.get("maximum", math.inf)

    least, most = bounds(props["tokenizer"]["properties"]["vocab_size"])
    return {"labels_bytes": jsonfile.LABELS_BYTES, "manifest_bytes": jsonfile.MANIFEST_BYTES,
            "intents": bounds(props["label_sets"]["properties"]["intents"]),
            "slot_tags": bounds(props["label_sets"]["properties"]["slot_tags"]),
            "pieces": (least, min(most, protofile.MAX_FIELDS - SP_OTHER_FIELDS)),
            "max_len": bounds(props["max_len"]),
            "bucket": bounds(props["buckets"]["properties"]["executorch"]["items"]["properties"]["max_len"])}


def _sizes(cfg: BuildConfig, data, folder: Path) -> tuple[int, int, Path]:
    """labels.json as the package stage writes it (its size and path), and the manifest's size from above: the
    intent names it may list in decoding.allowed_intents (with --intents, or an out-of-scope class the policy may
    keep out of the softmax), written as the package stage writes them, plus MANIFEST_REST."""
    from edgekit.io import write_json
    from edgekit.runtime.decode import OOS
    from edgekit.scoring.score import labels_of

    labels, part = folder / "labels.json", folder / "manifest.json"
    write_json(labels, labels_of(data))
    listed = list(cfg.intents or data.intents) if cfg.intents or data.oos_label else None
    write_json(part, {"decoding": {"allowed_intents": listed, "oos_answer": data.oos_label or OOS}})
    return labels.stat().st_size, part.stat().st_size + MANIFEST_REST, labels


def check_package_limits(cfg: BuildConfig, data, tokenizer, max_len: int, buckets: list[int], stages) -> int:
    """Refuse, before any training, data whose package the runtime would refuse on load (docs/package-format.md,
    "Checks on load"), in one line naming the data and the limit: labels.json's and the manifest's bytes, the
    label and piece counts and the sequence lengths against the manifest schema, and labels.json read as the
    runtime reads it (strict JSON, labels.schema.json). -> labels.json's size."""
    from edgekit.runtime.jsonfile import JSONFileError, read_json
    from edgekit.runtime.package import LABELS_SCHEMA_PATH
    from edgekit.runtime.schemas import first_error

    lim, where = package_limits(), data.source
    counts = [("intents", len(data.intents)), ("slot_tags", len(data.slot_tags)), ("max_len", max_len)]
    if "trim_vocab" not in stages:  # trim_vocab ships fewer pieces than the base has: how many is known after it
        counts.append(("pieces", tokenizer.vocab_size))
    for name, n in counts + [("bucket", b) for b in buckets]:
        least, most = lim[name]
        if not least <= n <= most:
            what, field, fix = LIMITED[name]
            bound = f"more than the {most:,}" if n > most else f"fewer than the {least:,}"
            raise EdgekitError(f"{where}: {n:,} {what}, {bound} a package may hold (the runtime checks the "
                               f"manifest's {field}); {fix}")
    with tempfile.TemporaryDirectory() as tmp:
        labels_bytes, manifest_bytes, labels = _sizes(cfg, data, Path(tmp))
        for n, most, what, names in ((labels_bytes, lim["labels_bytes"], "labels.json", "intent and slot-tag"),
                                     (manifest_bytes, lim["manifest_bytes"], "manifest.json", "intent")):
            if n > most:
                raise EdgekitError(f"{where}: the package's {what} would be {n:,} bytes, more than the "
                                   f"{most >> 20} MiB ({most:,} bytes) the runtime reads: {len(data.intents):,} "
                                   f"intents, {len(data.slot_tags):,} slot tags; shorten the {names} names or "
                                   "use fewer")
        try:
            why = first_error(read_json(labels, lim["labels_bytes"], "labels file"), LABELS_SCHEMA_PATH, "(labels)")
        except JSONFileError as e:
            why = str(e).replace(str(labels), "labels.json")
    if why:
        raise EdgekitError(f"{where}: the package's labels.json would be refused by the runtime: {why}")
    return labels_bytes


def _size_floor(settings, labels_bytes: int) -> None:
    """limits.max_size below the files every package of this data ships before any model: refused now."""
    from edgekit.engine.limits import size_floor
    from edgekit.runtime.package import SCHEMA_FILE, SCHEMA_PATH

    try:
        size_floor({SCHEMA_FILE: SCHEMA_PATH.stat().st_size, "labels.json": labels_bytes}, settings.limits.max_size)
    except ValueError as e:
        raise EdgekitError(f"limits.{e} (--max-size)") from None


def prepare(cfg: BuildConfig, check: bool = True) -> Context:
    """Resolve and check everything before any work: settings, target, data, base model, sequence length, OUT.
    `check`: run the data check (edgekit.data.check); distill.teacher's own prepare of the same data does not."""
    target, settings = resolve(cfg)
    if cfg.train_threads is not None and cfg.train_threads < 1:
        raise EdgekitError(f"train_threads must be >= 1, got {cfg.train_threads}")
    data = load_dataset(cfg.data, cfg.format, cfg.seed)
    check_trainable(data)  # refuse data that cannot train or be scored now, not after the first epoch
    cache = StageCache(default_dir(cfg.cache))
    cfg, base = _base(cfg, target, cache)
    hf = base_config(base)
    if hf["model_type"] == "mpnet" and "prune" in target.stages:
        raise EdgekitError(f"--base-model {cfg.base_model}: an MPNet model cannot be pruned, and --target "
                           f"{target.name} prunes; build it for server-cpu or server-gpu, or give --stages "
                           "without prune")
    sp = specials(base)
    try:
        tokenizer, rows = from_wordpiece(WordPieceTokenizer.from_file(base / "vocab.txt", specials=sp).vocab,
                                         cache_dir=cache.root / "normalizer", specials=sp)
    except ValueError as e:
        raise EdgekitError(f"{base / 'vocab.txt'}: {e}") from None
    texts = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    max_len, stats = choose_max_len(tokenizer, texts, max_positions(hf), target.bucket_percentiles)
    pk = settings.package
    if pk.max_len:
        max_len = stats["max_len"] = pk.max_len
    # shorter fixed lengths for ExecuTorch; package.buckets overrides the profile's percentiles
    stats["buckets"] = sorted({b for b in (stats["buckets"] if pk.buckets is None else pk.buckets) if b < max_len})
    # --strict-data: refused here, before any training
    checked = data_check(data, tokenizer, max_len, cfg.strict_data) if check else None
    unknown = [i for i in cfg.intents or [] if i not in data.intents]
    if unknown:
        raise EdgekitError(f"--intents: unknown intent {unknown[0]!r}; {cfg.data} has: {', '.join(data.intents)}")
    labels_bytes = check_package_limits(cfg, data, tokenizer, max_len, stats["buckets"], target.stages)
    _size_floor(settings, labels_bytes)
    writable(Path(cfg.out), "--out")  # refused now, not after training (an empty OUT may stay)
    digest = input_digest(data, cfg.out, base, sp)
    ctx = Context(cfg, settings, target, data, Path(cfg.out), max_len, stats, tokenizer, rows, target.stages,
                  cache, digest, base_model=base, data_check=checked)
    ctx.search = search.plan(ctx)  # limits.max_size / max_latency: the student's shape, before any training
    d = settings.distill
    if d.unlabelled and "distill" in ctx.stages:  # read now: a bad line is refused before any training
        ctx.unlabelled, ctx.unlabelled_dropped = unlabelled_pool(Path(d.unlabelled), d.unlabelled_max, data)
    if (d.assistant or d.unlabelled) and "distill" not in ctx.stages:
        log.warning("distill.%s: the %s profile has no distill stage; the setting does nothing",
                    "assistant" if d.assistant else "unlabelled", target.name)
    if settings.distill.teacher and "distill" in ctx.stages:  # its base model checked now, trained in _run
        name = settings.distill.teacher
        try:  # its own stages: no distill, so no teacher of its own to prepare (the stages are not in its key)
            ctx.strong_ctx = prepare(dataclasses.replace(cfg, base_model=name, target=STRONG_TEACHER_PROFILE,
                                                         stages=["teacher", "export", "package"]), check=False)
        except EdgekitError as e:  # the message names --base-model or a setting, as if it were a build of its own
            msg = str(e)
            raise EdgekitError(msg.replace("--base-model", "distill.teacher", 1) if msg.startswith("--base-model")
                               else f"distill.teacher {name} (trained as a {STRONG_TEACHER_PROFILE} build of it): "
                               f"{msg}") from None
    return ctx


# distill.teacher is fine-tuned as `edgekit build --target server-cpu --base-model NAME` (same data, --seed and
# settings) fine-tunes its teacher: the same cache key, so the server package and the device's teacher are one run.
STRONG_TEACHER_PROFILE = "server-cpu"


def strong_teacher(sub: Context, on_stage=None) -> TeacherResult:
    """The teacher stage of `sub` (Context.strong_ctx): reused from the cache, or trained and stored."""
    t0 = time.perf_counter()
    key = key_of(sub, "teacher", sub.input_digest)
    log.info("distill.teacher %s: its teacher stage", sub.cfg.base_model)
    res = run_stage(sub, "teacher", key, sub.input_digest)
    if on_stage:
        on_stage(f"teacher {sub.cfg.base_model}", dict(res.row, reused=res.reused, key=key[:12],
                                                       wall=time.perf_counter() - t0))
    return res


def fine_tuned_teacher(ctx: Context) -> TeacherResult:
    """distill.assistant's starting point: the teacher this build fine-tunes without it (its own cache key, so a
    build without the assistant reuses it), reused from the cache, or trained and stored."""
    d = dataclasses.replace(ctx.settings.distill, assistant=False)
    sub = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, distill=d), fine_tuned=None)
    return run_stage(sub, "teacher", key_of(sub, "teacher", ctx.input_digest), ctx.input_digest)


def run_stage(ctx: Context, name: str, key: str, input_key: str) -> StageResult:
    """Reuse the stage's cache entry, or run it and store its result."""
    from edgekit.engine.stages.common import seed_everything

    entry = ctx.cache.get(name, key)
    if entry is not None:
        try:
            res = result_type(name).load(entry.result, entry.path)
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
        res = registry.load(name).run(ctx)
        res.save(ctx.work)
        entry = ctx.cache.put(name, key, ctx.work, res.to_json())
    except BaseException:
        shutil.rmtree(ctx.work, ignore_errors=True)
        raise
    finally:
        ctx.work = None
    res.key, res.dir = key, entry.path
    return res


def build(cfg: BuildConfig, on_stage=None) -> dict:
    """Run (or reuse) the stages; returns report.json's content. `on_stage(name, row)` after each stage."""
    import torch

    from edgekit.modeling.perf import tune_allocator

    tune_allocator()
    ctx = prepare(cfg)  # every setting checked before any work or output
    if cfg.label_issues:
        ctx.label_issues = label_issues(ctx)
    before = torch.get_num_threads()  # torch's default: the physical cores, or $OMP_NUM_THREADS
    # Training runs on cfg.train_threads (default: torch's); latency is measured on the profile's threads (below).
    torch.set_num_threads(cfg.train_threads or before)
    try:
        return _run(ctx, on_stage)
    finally:
        torch.set_num_threads(before)  # a library caller gets its own setting back


def _run(ctx: Context, on_stage) -> dict:
    from edgekit.engine.gating import BudgetMissed, with_size_hint
    from edgekit.runtime.backends import set_threads

    old_plots = plots_listed(ctx.out)  # read before the first stage rewrites report.json
    log.info("training on %d threads", torch_threads())
    # XNNPACK's pool size can only be set before the first program loads; latency is measured on it.
    set_threads(ctx.target.bench_threads)
    if ctx.strong_ctx is not None:
        ctx.strong = strong_teacher(ctx.strong_ctx, on_stage)
        if ctx.settings.distill.assistant and "teacher" in ctx.stages:  # the teacher stage calls it if it runs
            ctx.fine_tuned = lambda: fine_tuned_teacher(ctx)
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
        attach = getattr(registry.load(name), "attach", None)
        if attach:
            attach(ctx, res)
        write(ctx.out, report(ctx))
        over = res.record.get("extra", {}).get("over_budget")
        if over and ctx.cfg.strict:
            raise BudgetMissed(with_size_hint(ctx, over["message"]) + "; --strict: no package written. Every try is "
                               "in the cache: loosen the budget (--set budget.intent_drop_pts=...) or compress less")
        if on_stage:
            on_stage(name, dict(res.row, reused=res.reused, key=key[:12], wall=time.perf_counter() - t0))
        if name == "teacher" and (ctx.search or {}).get("shortlist"):  # search.rank_epochs: measure the shortlist
            from edgekit.engine.rank import rank

            rank(ctx, out_key, run_stage, on_stage)
    for name, res in ctx.results():  # free the models: the report is what the caller gets
        if isinstance(res, ModelResult):
            res._model = None
    return finish(ctx, old_plots)
