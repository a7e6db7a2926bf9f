"""Stage `package`: tokenizer, labels and manifest beside the models; the package reloaded as an app would open
it and measured. The package is made in the stage's cache entry and copied into OUT/ (file by file, each
written to a temp file and renamed), so a reused package lands in OUT/ the same way."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from edgekit import __version__
from edgekit.engine.context import Context
from edgekit.engine.results import PackageResult, stage_row
from edgekit.engine.stages.common import model_file
from edgekit.io import write_bytes, write_json
from edgekit.modeling.model import count_params
from edgekit.record import PassRecord
from edgekit.runtime.decode import OOS
from edgekit.runtime.interface import check_element_types
from edgekit.runtime.jsonfile import MANIFEST_BYTES, read_json
from edgekit.runtime.package import MANIFEST, MODEL_FILES, SCHEMA_FILE, SCHEMA_PATH, SCHEMA_VERSION, Package, sha256
from edgekit.scoring.score import by_label, score
from edgekit.text.normalizer import NAME as NORMALIZER

TRT_FILE = "model.trt.onnx"  # the unfused FP32 graph, for TensorRT (which cannot parse the fused ops)
# Every file name a package may list besides the manifest: the only names a rebuild may remove from OUT/.
OWNED = frozenset({"tokenizer.model", "labels.json", SCHEMA_FILE, TRT_FILE, *MODEL_FILES.values()})


def answerable(labels: dict, dec: dict) -> list[str] | None:
    """G, the intents the graph can choose (docs/package-format.md R14): the build's --intents list, less the data's
    out-of-scope class when the policy keeps it out of the softmax; None when that is every intent."""
    from edgekit.converters.decoding import config_from_record

    mask = config_from_record(labels, dec).base_mask().tolist()
    return None if all(mask) else [name for name, ok in zip(labels["intents"], mask) if ok]


def manifest(ctx: Context, files: list[str], buckets: dict) -> dict:
    dec = ctx.export.decoding | (ctx.fuse.decoding if ctx.fuse else {})  # a lower server precision: its threshold
    n_int, L = len(ctx.data.intents), ctx.max_len
    B = "batch" if ctx.settings.server.batch else 1  # server graphs: a dynamic batch axis
    return {
        "schema_version": SCHEMA_VERSION,
        "schema": SCHEMA_FILE,  # the JSON Schema this manifest follows, shipped for clients (docs/package-format.md)
        "created_by": f"edgekit {__version__}",
        "task": ctx.cfg.task,
        "profile": ctx.target.name,
        "max_len": L,
        # BERT's basic pre-tokenizer is compiled into tokenizer.model's normalizer: sp.encode(word) is the whole job.
        "tokenizer": {"type": "sentencepiece", "file": "tokenizer.model", "normalizer": NORMALIZER,
                      "lowercase": ctx.tokenizer.lowercase, "vocab_size": ctx.tokenizer.vocab_size,
                      "special_ids": ctx.tokenizer.special_ids},
        "labels": "labels.json",
        "label_sets": {"intents": n_int, "slot_tags": len(ctx.data.slot_tags)},
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [B, L]},
                   {"name": "attention_mask", "dtype": "int64", "shape": [B, L]},
                   {"name": "word_pos", "dtype": "int64", "shape": [B, L - 2]},
                   {"name": "intent_mask", "dtype": "int32", "shape": [B, n_int] if B != 1 else [n_int]},
                   {"name": "reject", "dtype": "int32", "shape": [B]}],
        "outputs": ["intent", "confidence"] + (["tags", "path_confidence"] if ctx.data.has_slots else []),
        # The graph decodes: intent id (the id after the last intent is the reserved oos answer unless the data
        # has its own oos class), its confidence over the allowed intents, one BIO tag id per word and the whole
        # answer's path_confidence (schema 4).
        "decoding": {k: dec.get(k) for k in ("policy", "score", "threshold", "temperature", "oos_id")}
        | {"allowed_intents": answerable(ctx.labels, dec), "oos_answer": ctx.data.oos_label or OOS},
        "models": {r: MODEL_FILES[r] for r in ctx.target.runtimes},
        # Length buckets: one method per fixed length (shortest first); an app runs the shortest that holds the
        # utterance's pieces, with its inputs cut to that length. "forward" is the full length.
        **({"buckets": buckets} if buckets else {}),
        "primary_runtime": ctx.target.primary_runtime,
        # How `edgekit serve` runs it (providers in order, batching, replicas): the profile's [serve] table.
        **({"serve": dataclasses.asdict(ctx.settings.serve)} if ctx.settings.server.batch else {}),
        **({"seq_axis": "dynamic"} if ctx.settings.server.seq == "dynamic" else {}),
        # ONNX Runtime optimizers a session must not run: they would put back a fusion the build measured slower
        **({"onnx_disabled_optimizers": d} if "onnx" in ctx.target.runtimes
           and (d := ctx.settings.fuse.disabled_optimizers) else {}),
        # Device packages: when to ask a server (runtime/cascade.py); `edgekit compare` calibrates the threshold.
        **({} if ctx.settings.server.batch else {"cascade": {
            "threshold": None, "timeout_s": ctx.settings.cascade.timeout_s,
            "score": "path_confidence" if ctx.data.has_slots else "confidence"}}),
        **({"tensorrt_model": TRT_FILE} if TRT_FILE in files else {}),
        "files": {f: {"sha256": sha256(ctx.work / f), "bytes": (ctx.work / f).stat().st_size} for f in files},
    }


def _bucket_use(ctx: Context, texts: list[str], buckets: list[dict] | None) -> dict | None:
    """How many of the measured utterances each length bucket runs ({length: count})."""
    if not buckets:
        return None
    from edgekit.runtime.backends import pick_bucket

    lengths = [b["max_len"] for b in buckets]
    used = Counter(pick_bucket(lengths, ctx.tokenizer.length(t)) for t in texts)
    return {str(L): used.get(L, 0) for L in lengths}


def measure(ctx: Context, buckets: dict) -> dict:
    """Latency of each runtime's package graph, without decoding and before fusion, in a fresh process."""
    from edgekit.engine.latency import bench_texts
    from edgekit.tools.bench import in_fresh_process

    texts = bench_texts(ctx)  # the utterances the latency model's probes were timed on too
    threads, latency = ctx.target.bench_threads, {}
    if not texts:  # package.bench_utterances = 0: a build that only needs the package (the report says so)
        return latency
    for runtime in ctx.target.runtimes:
        raw_path = model_file(ctx, runtime, raw=True)
        unfused = raw_path.with_name("unfused." + MODEL_FILES[runtime])
        got = in_fresh_process("decoding_latency", package=str(ctx.work), runtime=runtime, texts=texts,
                               threads=threads, raw_path=str(raw_path) if raw_path.is_file() else None,
                               unfused_path=str(unfused) if unfused.is_file() else None)
        lat = got["decoding"]
        latency[runtime] = {"p50_ms": round(lat["p50_ms"], 3), "p99_ms": round(lat["p99_ms"], 3),
                            "threads": threads, "n": lat["n"], "max_len": ctx.max_len,
                            "buckets": _bucket_use(ctx, texts, buckets.get(runtime))}
        if "raw" in got:  # decoding.compare_argmax: the same model without the decoding graph
            latency[runtime]["without_decoding"] = {k: round(got["raw"][k], 3) for k in ("p50_ms", "p99_ms")}
            latency[runtime]["decoding_overhead"] = lat["p50_ms"] / got["raw"]["p50_ms"] - 1
        if "unfused" in got:
            latency[runtime]["unfused"] = {k: round(got["unfused"][k], 3) for k in ("p50_ms", "p99_ms")}
        if ctx.settings.server.batch:  # what batching buys on this machine: utterances per second by batch size
            latency[runtime]["batches"] = in_fresh_process("batch_throughput", package=str(ctx.work), texts=texts,
                                                           batches=[1, 8, 32], threads=threads)
    return latency


def run(ctx: Context) -> PackageResult:
    from edgekit.runtime.predictor import Predictor

    t0 = time.perf_counter()
    export = ctx.export.record["extra"]
    buckets = {r: export[r]["extra"]["buckets"] for r in ctx.target.runtimes
               if len(export[r]["extra"].get("buckets", [])) > 1}
    for runtime in ctx.target.runtimes:
        write_bytes(ctx.work / MODEL_FILES[runtime], model_file(ctx, runtime).read_bytes())
    ctx.tokenizer.save(ctx.work / "tokenizer.model")
    write_json(ctx.work / "labels.json", ctx.labels)
    write_bytes(ctx.work / SCHEMA_FILE, SCHEMA_PATH.read_bytes())
    files = ["tokenizer.model", "labels.json", SCHEMA_FILE] + [MODEL_FILES[r] for r in ctx.target.runtimes]
    if ctx.settings.server.batch and "tensorrt" in ctx.settings.serve.providers:
        write_bytes(ctx.work / TRT_FILE, (ctx.export.dir / MODEL_FILES["onnx"]).read_bytes())
        files.append(TRT_FILE)
    man = manifest(ctx, files, buckets)
    write_json(ctx.work / MANIFEST, man)
    pkg = Package.load(ctx.work)
    # every input and output of every graph shipped has an element type all phone and web bindings create
    interface = {r: check_element_types(ctx.work / MODEL_FILES[r]) for r in ctx.target.runtimes}
    sizes = {f: m["bytes"] for f, m in man["files"].items()}
    sizes[MANIFEST] = (ctx.work / MANIFEST).stat().st_size
    shared = sum(b for f, b in sizes.items() if f not in MODEL_FILES.values())
    per_runtime = {r: shared + sizes[MODEL_FILES[r]] for r in ctx.target.runtimes}
    info = {"size_bytes": per_runtime[ctx.target.primary_runtime], "runtime": ctx.target.primary_runtime,
            "size_bytes_per_runtime": per_runtime, "files": sizes, "digest": pkg.digest, "element_types": interface}
    latency = measure(ctx, buckets)
    rec = PassRecord("package", params_after=count_params(ctx.fp32().model), bytes_after=info["size_bytes"])
    # the package as shipped, opened as an app opens it
    p, test = Predictor.open(pkg, ctx.target.primary_runtime, threads=ctx.target.bench_threads), ctx.data.splits["test"]
    answers = [p.predict(ex.text, warn=False) for ex in test]
    rec.metrics = score(test, answers, ctx.labels)
    info["provider"] = p.provider  # the execution provider that answered (a server-gpu package on CPU says so)
    # each intent's and slot type's scores and the intents' confusion: report.md's worst few, confusion.png
    by = {"runtime": ctx.target.primary_runtime, "split": "test", **by_label(test, answers, ctx.labels)}
    rec.extra = {"latency": latency, "package": info, "by_label": by}
    rec.seconds = time.perf_counter() - t0
    row = stage_row("package", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return PackageResult(rec.to_dict(), row, latency=latency, package=info)


def attach(ctx: Context, res: PackageResult) -> None:
    """Publish the package (made or reused) into OUT/. The old manifest goes first, so a crash half-way leaves
    no package that claims to be whole; then each file temp-then-rename; the manifest comes last.

    OUT/ may hold the user's own files (notes, a checkpoints/ folder): only files edgekit writes are touched. A
    file the old manifest listed and the new one does not is removed only when its name is one a package uses
    and its bytes are still the ones that manifest recorded: anything the user made or changed stays."""

    ctx.out.mkdir(parents=True, exist_ok=True)
    old = ctx.out / MANIFEST
    stale = {}
    if old.is_file():
        try:
            listed = read_json(old, MANIFEST_BYTES, "manifest").get("files", {})
            stale = {f: m.get("sha256") for f, m in listed.items() if f in OWNED and f not in res.package["files"]}
        except (ValueError, AttributeError, OSError):  # not a manifest of ours: remove nothing on its word
            stale = {}
        old.unlink()
    for name in sorted(res.package["files"], key=lambda f: f == MANIFEST):
        write_bytes(ctx.out / name, (res.dir / name).read_bytes())
    for name, digest in stale.items():
        path = ctx.out / name
        if path.is_file() and not path.is_symlink() and sha256(path) == digest:
            path.unlink()
