"""`edgekit build`: named stages run in order, each saving a checkpoint and appending a report record.

Stages (this version): teacher -> export -> package. Later passes slot in between teacher and export.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit import __version__
from edgekit.data import Dataset, load_dataset
from edgekit.errors import EdgekitError
from edgekit.io import write_bytes, write_json, write_text
from edgekit.model import (
    JointModel,
    count_params,
    default_base_model,
    embedding_params,
    gather_embeddings,
    load_model,
    load_pretrained,
    save_model,
)
from edgekit.perf import tune_allocator
from edgekit.record import PassRecord
from edgekit.report import render_markdown
from edgekit.runtime.decode import OOS
from edgekit.runtime.package import MANIFEST, SCHEMA_VERSION, Package, sha256
from edgekit.runtime.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from edgekit.targets import Target, load_target
from edgekit.training import (
    TrainConfig,
    agreement,
    collate,
    featurize,
    joint_loss,
    labels_of,
    predict_eager,
    score,
    train_teacher,
)
from edgekit.vocab import from_wordpiece

log = logging.getLogger("edgekit")

STAGES = ("teacher", "trim_vocab", "prune", "distill", "quantize", "export", "fuse", "package")  # all known, in order
COMPRESS_DEFAULTS = {"vocab_budget": None, "param_share": 0.25, "total_share": 1.0, "max_retries": 2, "backoff": 1.2,
                     "distill_epochs": 8, "distill_lr": 4e-4, "temperature": 4.0, "alpha": 0.7, "hidden_weight": 1.0,
                     "prune_samples": 512, "prune_layers": 0, "embedding_rank": None, "distill_augment": 0.0,
                     "distill_novel": 0.0, "word_pool": False}
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
    buckets: list[int] | None = None  # shorter ExecuTorch lengths (default: the profile's bucket_percentiles)
    bench_utterances: int = 200
    train: TrainConfig = field(default_factory=TrainConfig)
    stages: list[str] | None = None  # default: the target profile's list
    vocab_corpus: str | None = None  # extra text, one utterance per line, whose pieces the vocabulary keeps
    intents: list[str] | None = None  # build-time intent whitelist baked into the graph (None: all)
    oos_far: float = 0.05  # without out-of-scope data: share of held-out in-scope utterances the threshold rejects
    # Overrides of the profile's [compress] table, e.g. {"vocab_budget": 0 (no budget), "param_share": 0.3,
    # "total_share", "distill_epochs", "distill_lr", "temperature", "alpha", "max_retries", "backoff"}.
    compress: dict = field(default_factory=dict)
    # Overrides of the profile's [quantize] table (QuantizeConfig fields), e.g. {"keep_fp32": ["layers.0.*"]}.
    quantize: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task != "intent":
            raise EdgekitError(f"unknown --task {self.task!r}; supported: intent")
        if self.stages is not None:
            unknown = [s for s in self.stages if s not in STAGES]
            if unknown:
                raise EdgekitError(f"unknown stage {unknown[0]!r}; stages: {', '.join(STAGES)}")
            if self.stages[0] != "teacher" or self.stages[-1] != "package" or "export" not in self.stages[-3:]:
                raise EdgekitError("stages must start with teacher and end with export, (fuse,) package")
            if [STAGES.index(x) for x in self.stages] != sorted({STAGES.index(x) for x in self.stages}):
                raise EdgekitError(f"stages run in this order, each once: {', '.join(STAGES)}")
        from edgekit.converters.quantize_executorch import QuantizeConfig

        try:
            QuantizeConfig(**self.quantize)
        except (TypeError, ValueError) as e:
            raise EdgekitError(f"quantize setting: {e}") from None
        unknown = set(self.compress) - set(COMPRESS_DEFAULTS)
        if unknown:
            raise EdgekitError(f"unknown compression setting {sorted(unknown)[0]!r}")
        share = self.compress.get("param_share")
        if share is not None and not 0 < share <= 1:
            raise EdgekitError(f"--param-share must be in (0, 1], got {share}")
        if not 0 <= self.oos_far < 1:
            raise EdgekitError(f"--oos-far must be in [0, 1), got {self.oos_far}")
        if self.intents is not None and not self.intents:
            raise EdgekitError("--intents is empty")
        if self.max_len is not None and not 8 <= self.max_len <= 512:
            raise EdgekitError(f"--max-len must be in 8..512, got {self.max_len}")
        if self.buckets and min(self.buckets) < 3:
            raise EdgekitError(f"--buckets: lengths must be >= 3, got {min(self.buckets)}")


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
    teacher: JointModel | None = None
    teacher_tokenizer: SentencePieceTokenizer | None = None
    teacher_dev: dict = field(default_factory=dict)
    compress: dict = field(default_factory=dict)  # the profile's [compress] table with CLI overrides applied
    prune_scale: float = 1.0  # grows when the distill gate backs off (prune less)
    stages: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    checkpoint: dict = field(default_factory=dict)  # latest {"model": file, "tokenizer": file} in checkpoints/
    cache: dict = field(default_factory=dict)  # in-memory only: teacher answers, the pre-prune model
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
        keys = ("intent_acc", "slot_f1", "slot_f1_argmax", "exact_match", "in_scope_acc", "oos_recall")
        row = {"name": name, **{k: metrics.get(k) for k in keys if k in metrics}}
        row.update(params=params, size_bytes=size_bytes, seconds=round(seconds, 2))
        return row

    def set_row(self, row: dict, rec: PassRecord) -> None:
        """Add a stage's row and record, replacing an earlier one of the same stage (a retried stage)."""
        for lst, item in ((self.rows, row), (self.records, rec.to_dict())):
            names = [x["name"] for x in lst]
            if item["name"] in names:
                lst[names.index(item["name"])] = item
            else:
                lst.append(item)

    def evaluate(self, model: JointModel, tokenizer, split: str) -> dict:
        """Metrics of `model` as the package will answer: with the decoding graph (intent whitelist, BIO Viterbi
        with the intent-slot whitelist), rejection off. slot_f1_argmax: the same model decoded by plain argmax."""
        from edgekit.converters.decoding import DecodingConfig, with_decoding

        examples = self.data.splits[split]
        decoded, _ = with_decoding(model, DecodingConfig(self.data.intents, self.data.slot_tags,
                                                         self.intent_slots(), self.cfg.intents, self.data.oos_label))
        m = score(examples, predict_eager(decoded, examples, tokenizer, self.labels, self.max_len, reject=False),
                  self.labels)
        if m["slot_f1"] is not None:
            argmax = predict_eager(model, examples, tokenizer, self.labels, self.max_len)
            m["slot_f1_argmax"] = score(examples, argmax, self.labels)["slot_f1"]
        return m

    def intent_slots(self) -> dict | None:
        """The intent-to-slot whitelist (slots seen with each intent in train), or None when it does not pay.

        Measured once, with the teacher on dev: the whitelist is kept unless decoding without it gives a higher
        slot F1 (on ATIS, intents whose test utterances carry slots never seen with them in train make it cost
        0.3-0.7 pt). The choice and both figures go into the report."""
        from edgekit.converters.decoding import DecodingConfig, intent_slots_seen, with_decoding

        if "intent_slots" not in self.cache:
            seen = intent_slots_seen(self.data.splits["train"]) if self.data.has_slots else None
            if seen is not None and self.teacher is not None:
                dev, f1 = self.data.splits["dev"], {}
                for key, table in (("with", seen), ("without", None)):
                    dm, _ = with_decoding(self.teacher, DecodingConfig(self.data.intents, self.data.slot_tags, table,
                                                                       self.cfg.intents, self.data.oos_label))
                    answers = predict_eager(dm, dev, self.teacher_tokenizer, self.labels, self.max_len, reject=False)
                    f1[key] = score(dev, answers, self.labels)["slot_f1"]
                self.cache["intent_slots_choice"] = {"used": f1["with"] >= f1["without"],
                                                     "teacher_dev_slot_f1_with": f1["with"],
                                                     "teacher_dev_slot_f1_without": f1["without"]}
                seen = seen if f1["with"] >= f1["without"] else None
            self.cache["intent_slots"] = seen
        return self.cache["intent_slots"]

    def save_checkpoint(self, stage: str) -> None:
        save_model(self.model, self.ckpt_dir / f"{stage}.safetensors")
        write_bytes(self.ckpt_dir / f"{stage}.tokenizer.model", self.tokenizer.model_proto)
        self.checkpoint = {"model": f"{stage}.safetensors", "tokenizer": f"{stage}.tokenizer.model"}


def _base_model_dir(cfg: BuildConfig) -> Path:
    return Path(cfg.base_model) if cfg.base_model else default_base_model()


def seed_everything(seed: int) -> None:
    """Seed every generator a stage may draw from, before it creates any module (fresh heads included)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def stage_teacher(ctx: Context) -> tuple[dict, PassRecord]:
    model = load_pretrained(_base_model_dir(ctx.cfg), len(ctx.data.intents), len(ctx.data.slot_tags))
    gather_embeddings(model, ctx.base_rows)  # WordPiece rows -> the teacher's SentencePiece ids
    model, rec = train_teacher(model, ctx.data, ctx.tokenizer, ctx.cfg.train)
    ctx.model, ctx.teacher, ctx.teacher_tokenizer = model, model, ctx.tokenizer
    ctx.save_checkpoint("teacher")
    t1 = time.perf_counter()
    rec.metrics = ctx.evaluate(model, ctx.tokenizer, "test")
    ctx.teacher_dev = ctx.evaluate(model, ctx.tokenizer, "dev")
    rec.extra["dev"] = ctx.teacher_dev
    rec.seconds += time.perf_counter() - t1
    return ctx.stage_row("teacher", rec.metrics, count_params(model), rec.bytes_after, rec.seconds), rec


def _check_inputs(ctx: Context, decoding: bool, n: int = 64) -> list[list[np.ndarray]]:
    """Real test utterances as graph inputs; decoded graphs also see a restricted intent mask and rejection off."""
    from edgekit.runtime.predictor import model_inputs

    encs = [ctx.tokenizer.encode(ex.text, ctx.max_len) for ex in ctx.data.splits["test"][:n]]
    n_int = len(ctx.data.intents)
    some = np.arange(n_int) % 2 == 0  # every other intent allowed
    return [model_inputs(e, n_int, decoding, some if decoding and k % 4 == 3 else None, k % 3 != 2)
            for k, e in enumerate(encs)]


def _runtime_answers(ctx: Context, runtime: str, path: Path, decoding: bool, reject: bool = False) -> list[dict]:
    from edgekit.runtime.backends import BACKENDS
    from edgekit.runtime.predictor import Predictor

    p = Predictor(BACKENDS[runtime](path), ctx.tokenizer, ctx.labels, ctx.max_len, decoding)
    return [p.predict(ex.text, warn=False, reject=reject) for ex in ctx.data.splits["test"]]


def _decoding(ctx: Context):
    """The decoding graph for this build: intent whitelist, intent-to-slot whitelist, out-of-scope policy.

    With out-of-scope examples in dev, two policies are calibrated there (each: the most out-of-scope recall
    with in-scope accuracy at most 2 points under no threshold) and the one with the higher recall kept: the
    trained oos class plus a confidence threshold, or a threshold on the in-scope intents alone (oos class left
    out of the softmax). Without them, the threshold rejects `oos_far` of the
    held-out in-scope (dev) utterances."""
    from edgekit.converters.decoding import (
        DecodingConfig,
        best_threshold,
        threshold_for_rate,
        with_decoding,
    )

    data = ctx.data
    allowed = ctx.cfg.intents
    dev = [ex for ex in data.splits["dev"] if allowed is None or ex.intent in allowed or ex.intent == data.oos_label]
    base = {"intents": data.intents, "slot_tags": data.slot_tags, "allowed_intents": allowed,
            "oos_label": data.oos_label, "intent_slots": ctx.intent_slots()}
    oos = data.oos_label
    is_oos = np.array([ex.intent == oos for ex in dev]) if oos else np.zeros(len(dev), bool)

    def answers(cfg):  # eager answers of the decoding graph without rejection
        dm, _ = with_decoding(ctx.model, cfg)
        return predict_eager(dm, dev, ctx.tokenizer, ctx.labels, ctx.max_len, reject=False)

    if is_oos.any():
        candidates = {}
        for policy, in_softmax in (("oos class + threshold", True), ("threshold on in-scope intents", False)):
            ans = answers(DecodingConfig(**base, oos_in_softmax=in_softmax))
            conf = np.array([a["confidence"] for a in ans])
            ok = np.array([a["intent"] == ex.intent for a, ex in zip(ans, dev)])
            tau, figs = best_threshold(conf, ok, is_oos, np.array([a["intent"] == oos for a in ans]))
            candidates[policy] = {"oos_in_softmax": in_softmax, "threshold": tau, "dev": figs}
        policy = max(candidates, key=lambda k: (candidates[k]["dev"]["oos_recall"], candidates[k]["dev"]["in_scope_acc"]))
        chosen = candidates[policy]
        info = {"policy": policy, "threshold": chosen["threshold"], "candidates": candidates,
                "calibration": f"dev: {int((~is_oos).sum())} in-scope and {int(is_oos.sum())} out-of-scope "
                               "utterances; the threshold that catches the most out-of-scope utterances while "
                               "in-scope accuracy stays within 2 points of its value without one"}
        cfg = DecodingConfig(**base, oos_in_softmax=chosen["oos_in_softmax"], threshold=chosen["threshold"])
    else:
        far = ctx.cfg.oos_far
        conf = np.array([a["confidence"] for a in answers(DecodingConfig(**base))])
        tau = threshold_for_rate(conf, far)
        info = {"policy": "threshold (no out-of-scope data)", "threshold": tau, "oos_far": far,
                "calibration": f"no out-of-scope examples: the threshold rejects {100 * far:.1f}% of the "
                               f"{len(dev)} held-out in-scope (dev) utterances (--oos-far); out-of-scope recall "
                               "cannot be measured on this data"}
        cfg = DecodingConfig(**base, threshold=tau)
    dm, rec = with_decoding(ctx.model, cfg)
    rec.extra.update(info, intent_slot_choice=ctx.cache.get("intent_slots_choice"))
    return dm, rec


def _onnx_int8(ctx: Context, model, ecfg, path: Path, decoding: bool) -> PassRecord:
    """Export `model` (FP32) to ONNX, then ONNX Runtime's static INT8 (QDQ) with the build's calibration."""
    from edgekit.converters.export_onnx import export_onnx
    from edgekit.converters.quantize_onnx import quantize_onnx

    fp32_path = path.with_name(path.stem + ".fp32.onnx")
    r = export_onnx(model, ecfg, fp32_path, _check_inputs(ctx, decoding))
    cfg = quantize_config(ctx)
    q = quantize_onnx(fp32_path, path, cfg, _calibration(ctx, cfg.calib_samples, decoding))
    fp32_path.unlink()
    r.extra["quantize"] = q.extra
    r.warnings += q.warnings
    r.extra["fp32_bytes"], r.bytes_after = r.bytes_after, q.bytes_after
    return r


def _fuse(ctx: Context, path: Path, decoding: bool) -> dict:
    """ONNX Runtime's offline graph optimizations: `unfused.<name>` (the export, kept for the latency columns)
    -> `path`, checked on the whole test split. Rerunnable: a resumed build fuses from the kept export."""
    from edgekit.converters.fuse import fuse_onnx
    from edgekit.runtime.predictor import model_inputs

    n = len(ctx.data.intents)
    checks = [model_inputs(ctx.tokenizer.encode(ex.text, ctx.max_len), n, decoding, reject=False)
              for ex in ctx.data.splits["test"]]
    unfused = path.with_name("unfused." + path.name)
    if not unfused.is_file():
        path.replace(unfused)
    rec = fuse_onnx(unfused, path, checks)
    return rec.extra | {"seconds": round(rec.seconds, 2)}


def stage_fuse(ctx: Context) -> tuple[dict, PassRecord]:
    """Fixed-shape fusion. ONNX: ONNX Runtime's offline optimizations on the exported graphs (with and without
    decoding), saved, node counts before and after, fused against unfused answers on the whole test split; the
    row scores the fused ONNX model. ExecuTorch fused inside XNNPACK when it was lowered (export stage): its
    delegated share is carried into this record."""
    t0 = time.perf_counter()
    export = next(r for r in ctx.records if r["name"] == "export")["extra"]
    rec = PassRecord("fuse", params_before=count_params(ctx.model), params_after=count_params(ctx.model))
    if "executorch" in export:
        et = export["executorch"]["extra"]
        rec.extra["executorch"] = {k: et[k] for k in ("delegated_share", "delegated_compute_ops",
                                                      "portable_compute_ops", "delegate_calls") if k in et}
        rec.extra["executorch"]["raw_delegation"] = et.get("decoding", {}).get("raw_delegation")
    runtime = "onnx" if "onnx" in ctx.target.runtimes else ctx.target.primary_runtime
    path = ctx.ckpt_dir / MODEL_FILES[runtime]
    if runtime == "onnx":
        rec.extra["onnx"] = _fuse(ctx, path, True)
        rec.extra["onnx_raw"] = _fuse(ctx, ctx.ckpt_dir / "raw.onnx", False)
        rec.bytes_before = (ctx.ckpt_dir / ("unfused." + path.name)).stat().st_size
    rec.metrics = score(ctx.data.splits["test"], _runtime_answers(ctx, runtime, path, True), ctx.labels)
    rec.bytes_after, rec.seconds = path.stat().st_size, time.perf_counter() - t0
    row = ctx.stage_row("fuse", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = runtime
    return row, rec


def stage_export(ctx: Context) -> tuple[dict, PassRecord]:
    """Export each of the target's runtimes with the decoding graph, check vs eager, score on the whole test split.

    The raw graph (logits, argmax decoding) is exported next to it under checkpoints/, so that plain argmax and
    constrained decoding are compared on the same runtime, and so is their latency (package stage)."""
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
    from edgekit.metrics import invalid_bio

    t0 = time.perf_counter()
    exporters = {"executorch": (export_executorch, ExecuTorchExportConfig(ctx.max_len, ctx.length_stats["buckets"])),
                 "onnx": (export_onnx, OnnxExportConfig(ctx.max_len))}
    decoded, drec = _decoding(ctx)
    test = ctx.data.splits["test"]
    eager = predict_eager(decoded, test, ctx.tokenizer, ctx.labels, ctx.max_len, reject=False)
    rec = PassRecord("export", params_before=count_params(ctx.model), params_after=count_params(ctx.model))
    rec.extra["decoding"] = drec.to_dict()["extra"]
    fp32 = ctx.cache.get("fp32_model")  # set by the quantize stage: ONNX Runtime quantizes its own export
    for stale in ctx.ckpt_dir.glob("unfused.*"):  # the fuse stage's copy of an earlier export (a resumed build)
        stale.unlink()
    for runtime in ctx.target.runtimes:
        fn, ecfg = exporters[runtime]
        # Staged under checkpoints/: the package in OUT/ changes only when the package stage completes.
        path = ctx.ckpt_dir / MODEL_FILES[runtime]
        raw_path = ctx.ckpt_dir / ("raw." + MODEL_FILES[runtime].split(".")[-1])
        if runtime == "onnx" and fp32 is not None:
            dm, _ = with_decoding(fp32, config_from_record(ctx.labels, rec.extra["decoding"]))
            r = _onnx_int8(ctx, dm, ecfg, path, True)
            raw = _onnx_int8(ctx, fp32, ecfg, raw_path, False)
        else:
            r = fn(decoded, ecfg, path, _check_inputs(ctx, True))
            raw = fn(ctx.model, ecfg, raw_path, _check_inputs(ctx, False))
        answers = _runtime_answers(ctx, runtime, path, True)
        r.metrics = score(test, answers, ctx.labels)
        r.extra["agreement_with_eager"] = agreement(answers, eager)
        raw_answers = _runtime_answers(ctx, runtime, raw_path, False)
        shipped = _runtime_answers(ctx, runtime, path, True, reject=True)  # as the app gets them by default
        rejecting = score(test, shipped, ctx.labels)
        r.metrics["slot_f1_argmax"] = score(test, raw_answers, ctx.labels).get("slot_f1")
        r.extra["decoding"] = {
            "argmax": {"slot_f1": r.metrics["slot_f1_argmax"],
                       "invalid_bio": invalid_bio([a.get("tags") for a in raw_answers])},
            "constrained": {"slot_f1": r.metrics.get("slot_f1"),
                            "invalid_bio": invalid_bio([a.get("tags") for a in answers])},
            "with_rejection": {k: rejecting.get(k) for k in ("intent_acc", "in_scope_acc", "oos_recall")},
            "rejected_share": sum(a["intent"] == (ctx.data.oos_label or OOS) for a in shipped) / len(test),
            "raw_parity": raw.extra["parity"], "raw_bytes": raw.bytes_after,
            "raw_delegation": {k: raw.extra[k] for k in ("delegated_share", "delegated_compute_ops",
                                                         "portable_compute_ops") if k in raw.extra}}
        rec.extra[runtime] = r.to_dict()
        rec.warnings += r.warnings
        log.info("%s: %s bytes, agreement with eager %.4f, max abs diff %.2e", runtime, r.bytes_after,
                 r.extra["agreement_with_eager"], r.extra["parity"]["max_abs_diff"])
    primary = rec.extra[ctx.target.primary_runtime]
    rec.metrics, rec.bytes_after = primary["metrics"], primary["bytes_after"]
    rec.seconds = time.perf_counter() - t0
    ctx.cache["decoding"] = rec.extra["decoding"]
    row = ctx.stage_row("export", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    return row, rec


def stage_package(ctx: Context) -> tuple[dict, PassRecord]:
    """Write tokenizer, labels and manifest; reload the package as an app would; measure it."""
    from edgekit.bench import in_fresh_process
    from edgekit.runtime.predictor import Predictor

    t0 = time.perf_counter()
    export = next(r for r in ctx.records if r["name"] == "export")["extra"]
    dec = export["decoding"]
    buckets = {r: export[r]["extra"]["buckets"] for r in ctx.target.runtimes
               if len(export[r]["extra"].get("buckets", [])) > 1}
    for runtime in ctx.target.runtimes:
        write_bytes(ctx.out / MODEL_FILES[runtime], (ctx.ckpt_dir / MODEL_FILES[runtime]).read_bytes())
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
                   {"name": "attention_mask", "dtype": "int64", "shape": [1, ctx.max_len]},
                   {"name": "word_pos", "dtype": "int64", "shape": [1, ctx.max_len - 2]},
                   {"name": "intent_mask", "dtype": "bool", "shape": [len(ctx.data.intents)]},
                   {"name": "reject", "dtype": "bool", "shape": [1]}],
        "outputs": ["intent", "confidence"] + (["tags"] if ctx.data.has_slots else []),
        # The graph decodes: intent id (the id after the last intent is the reserved oos answer unless the data
        # has its own oos class), its confidence over the allowed intents, and one BIO tag id per word.
        "decoding": {k: dec[k] for k in ("policy", "threshold", "oos_id", "allowed_intents")}
        | {"oos_answer": ctx.data.oos_label or OOS},
        "models": {r: MODEL_FILES[r] for r in ctx.target.runtimes},
        # Length buckets: one method per fixed length (shortest first); an app runs the shortest that holds the
        # utterance's pieces, with its inputs cut to that length. "forward" is the full length.
        **({"buckets": buckets} if buckets else {}),
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
        # The same model without the decoding graph, measured in the same run: what decoding costs.
        raw_path = ctx.ckpt_dir / ("raw." + MODEL_FILES[runtime].split(".")[-1])
        unfused = ctx.ckpt_dir / ("unfused." + MODEL_FILES[runtime])
        lat, lat_raw, *lat_unfused = in_fresh_process(
            "decoding_latency", package=str(ctx.out), runtime=runtime, raw_path=str(raw_path), texts=texts,
            threads=ctx.target.bench_threads, unfused_path=str(unfused) if unfused.is_file() else None)
        ctx.latency[runtime] = {"p50_ms": round(lat["p50_ms"], 3), "p99_ms": round(lat["p99_ms"], 3),
                                "threads": ctx.target.bench_threads, "n": lat["n"], "max_len": ctx.max_len,
                                "buckets": _bucket_use(ctx, texts, buckets.get(runtime)),
                                "without_decoding": {"p50_ms": round(lat_raw["p50_ms"], 3),
                                                     "p99_ms": round(lat_raw["p99_ms"], 3)},
                                "decoding_overhead": lat["p50_ms"] / lat_raw["p50_ms"] - 1}
        if lat_unfused:
            ctx.latency[runtime]["unfused"] = {k: round(lat_unfused[0][k], 3) for k in ("p50_ms", "p99_ms")}
        if runtime == ctx.target.primary_runtime:  # the package as shipped, opened as an app opens it
            p, test = Predictor.open(pkg, runtime, threads=ctx.target.bench_threads), ctx.data.splits["test"]
            rec.metrics = score(test, [p.predict(ex.text, warn=False) for ex in test], ctx.labels)
    rec.extra = {"latency": ctx.latency, "package": ctx.package}
    rec.seconds = time.perf_counter() - t0
    row = ctx.stage_row("package", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds)
    row["runtime"] = ctx.target.primary_runtime
    # The stage table's latency columns, from the one measurement above: the exported graphs as they were after
    # export (ONNX before fusion) and after fuse; ExecuTorch's program does not change after export.
    shipped = {rt: {k: lat[k] for k in ("p50_ms", "p99_ms")} for rt, lat in ctx.latency.items()}
    row["latency"] = shipped
    for r in ctx.rows:
        if r["name"] == "fuse":
            r["latency"] = shipped
        elif r["name"] == "export":
            r["latency"] = {rt: ctx.latency[rt].get("unfused", v) for rt, v in shipped.items()}
    return row, rec


def _bucket_use(ctx: Context, texts: list[str], buckets: list[dict] | None) -> dict | None:
    """How many of the measured utterances each length bucket runs ({length: count})."""
    if not buckets:
        return None
    from edgekit.runtime.backends import pick_bucket

    lengths = [b["max_len"] for b in buckets]
    used = Counter(pick_bucket(lengths, ctx.tokenizer.length(t)) for t in texts)
    return {str(L): used.get(L, 0) for L in lengths}


def gate(ctx: Context, dev: dict) -> tuple[bool, dict]:
    """Compare dev metrics with the teacher's against the profile's budget (points on a 0-100 scale)."""
    budget = ctx.target.budget
    drops = {"intent_drop_pts": 100 * (ctx.teacher_dev["intent_acc"] - dev["intent_acc"])}
    if dev.get("slot_f1") is not None:
        drops["slot_f1_drop_pts"] = 100 * (ctx.teacher_dev["slot_f1"] - dev["slot_f1"])
    ok = all(v <= budget.get(k, math.inf) + 1e-9 for k, v in drops.items())
    return ok, {k: round(v, 3) for k, v in drops.items()}


def gate_failure(stage: str, ctx: Context, tries: list[dict]) -> EdgekitError:
    best = min(tries, key=lambda t: sum(t["drops"].values()))
    budget = ", ".join(f"{k} <= {v}" for k, v in ctx.target.budget.items())
    figs = ", ".join(f"{k} {v}" for k, v in best["drops"].items())
    return EdgekitError(f"stage {stage}: dev accuracy budget ({budget}) not met in {len(tries)} tries; best reached "
                        f"{figs} ({best['setting']}). Nothing in {ctx.out} was changed by this stage; loosen the "
                        f"budget in devices/{ctx.target.name}.toml or compress less")


def _corpus(ctx: Context) -> list[str]:
    texts = [ex.text for s in ("train", "dev") for ex in ctx.data.splits[s]]
    if ctx.cfg.vocab_corpus:
        path = Path(ctx.cfg.vocab_corpus)
        if not path.is_file():
            raise EdgekitError(f"{path}: --vocab-corpus file not found")
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return texts


def _teacher_test_answers(ctx: Context) -> list[dict]:
    if "teacher_test" not in ctx.cache:
        test = ctx.data.splits["test"]
        ctx.cache["teacher_test"] = predict_eager(ctx.teacher, test, ctx.teacher_tokenizer, ctx.labels, ctx.max_len)
    return ctx.cache["teacher_test"]


def stage_trim_vocab(ctx: Context) -> tuple[dict, PassRecord]:
    """Task vocabulary as SentencePiece; gate on dev; back off by a larger vocabulary budget."""
    from edgekit.converters.trim_vocab import TrimVocabConfig, trim_vocab

    t0 = time.perf_counter()
    corpus = _corpus(ctx)
    budget = ctx.compress.get("vocab_budget") or None
    tries = []
    for attempt in range(ctx.compress["max_retries"] + 1):
        model, rec = trim_vocab(copy.deepcopy(ctx.model), TrimVocabConfig(ctx.tokenizer, corpus, budget, ctx.max_len,
                                                                          ctx.compress.get("embedding_rank")))
        tok = rec.artifacts["tokenizer"]
        dev = ctx.evaluate(model, tok, "dev")
        ok, drops = gate(ctx, dev)
        tries.append({"setting": f"vocabulary budget {budget or 'none'}", "dev": dev, "drops": drops, "passed": ok})
        log.info("trim_vocab try %d: %d pieces, dev drops %s -> %s", attempt + 1, tok.vocab_size, drops,
                 "pass" if ok else "back off")
        if ok:
            break
        if budget is None:
            break
        budget = int(budget * 1.25) if budget * 1.25 < rec.extra["vocab_task"] else None
    if not tries[-1]["passed"]:
        raise gate_failure("trim_vocab", ctx, tries)
    rec.metrics = ctx.evaluate(model, tok, "test")
    answers = predict_eager(model, ctx.data.splits["test"], tok, ctx.labels, ctx.max_len)
    teacher = _teacher_test_answers(ctx)
    rec.extra["intent_agreement_with_teacher"] = sum(a["intent"] == b["intent"] for a, b in zip(answers, teacher)) / len(
        answers)
    if budget is not None:  # the accuracy cost of the budget: the same trim at the full task vocabulary
        full, frec = trim_vocab(copy.deepcopy(ctx.model), TrimVocabConfig(ctx.tokenizer, corpus, None, ctx.max_len,
                                                                          ctx.compress.get("embedding_rank")))
        rec.extra["full_vocab"] = {"vocab": frec.extra["vocab_after"], "params": frec.params_after,
                                   "test": ctx.evaluate(full, frec.artifacts["tokenizer"], "test")}
    rec.extra["tries"] = tries
    ctx.model, ctx.tokenizer = model, tok
    ctx.save_checkpoint("trim_vocab")
    rec.seconds = time.perf_counter() - t0
    return ctx.stage_row("trim_vocab", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds), rec


def prune_target(ctx: Context) -> int:
    """Non-embedding parameters the student may keep: the profile's share of the teacher's, and no more than
    the total-size share leaves after the (trimmed) embeddings; scaled up when the distill gate backs off."""
    share, total_share = ctx.compress["param_share"], ctx.compress.get("total_share", 1.0)
    by_nonembed = share * count_params(ctx.teacher, embeddings=False)
    by_total = total_share * count_params(ctx.teacher) - embedding_params(ctx.model)
    return int(min(by_nonembed, by_total) * ctx.prune_scale)


def stage_prune(ctx: Context) -> tuple[dict, PassRecord]:
    from edgekit.converters.prune import PruneConfig, prune

    t0 = time.perf_counter()
    if "pre_prune" not in ctx.cache:  # pruning always starts from the stage before it (also on a retry)
        before = ctx.stages[ctx.stages.index("prune") - 1]
        ctx.cache["pre_prune"] = load_model(ctx.ckpt_dir / f"{before}.safetensors") if "prune" in ctx.done \
            else ctx.model
    base = ctx.cache["pre_prune"]
    train = ctx.data.splits["train"]
    rng = random.Random(ctx.cfg.seed)
    sample = rng.sample(train, min(len(train), ctx.compress.get("prune_samples", 512)))
    # The student's position table is cut to the package length (trim_vocab): it trains on what it will see.
    feats = featurize(sample, ctx.tokenizer, ctx.labels, ctx.max_len)
    batches = [collate(feats, list(range(i, min(i + 32, len(sample)))), ctx.tokenizer.pad_id)
               for i in range(0, len(sample), 32)]
    cfg = PruneConfig(target_params=prune_target(ctx), batches=batches, drop_layers=ctx.compress["prune_layers"],
                      loss_fn=lambda out, i, s: joint_loss(out, i, s, 1.0))
    model, rec = prune(copy.deepcopy(base), cfg)
    rec.metrics = ctx.evaluate(model, ctx.tokenizer, "test")
    rec.extra["dev"] = ctx.evaluate(model, ctx.tokenizer, "dev")
    rec.extra["note"] = "before distillation; the accuracy gate for pruning runs after the distill stage"
    ctx.model = model
    ctx.save_checkpoint("prune")
    rec.seconds = time.perf_counter() - t0
    return ctx.stage_row("prune", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds), rec


def stage_distill(ctx: Context) -> tuple[dict, PassRecord]:
    """Distil into the pruned student; gate on dev; back off by pruning less and distilling again."""
    from edgekit.converters.distill import DistillConfig, distill

    t0 = time.perf_counter()
    c = ctx.compress
    tries = []
    for attempt in range(c["max_retries"] + 1):
        prune_rec = next((r for r in ctx.records if r["name"] == "prune"), None)
        # Each student layer matches the teacher layer it was pruned from (state index = layer + 1).
        layer_map = [k + 1 for k in prune_rec["extra"]["kept_layers"]] if prune_rec else None
        cfg = DistillConfig(teacher=ctx.teacher, teacher_tokenizer=ctx.teacher_tokenizer,
                            student_tokenizer=ctx.tokenizer, train=ctx.data.splits["train"],
                            dev=ctx.data.splits["dev"], labels=ctx.labels, temperature=c["temperature"],
                            alpha=c["alpha"], hidden_weight=c["hidden_weight"], layer_map=layer_map,
                            epochs=c["distill_epochs"], lr=c["distill_lr"], seed=ctx.cfg.seed,
                            max_len=ctx.max_len, augment=c["distill_augment"],
                            novel_share=c["distill_novel"], word_pool=bool(c["word_pool"]),
                            steps_limit=ctx.cfg.train.steps_limit,
                            evaluate=lambda m: ctx.evaluate(m, ctx.tokenizer, "dev"))  # epochs chosen as shipped
        model, rec = distill(copy.deepcopy(ctx.model), cfg)
        dev = rec.extra.pop("best_dev")  # ctx.evaluate on dev of the kept epoch, computed during distillation
        ok, drops = gate(ctx, dev)
        nonemb = count_params(model, embeddings=False)
        tries.append({"setting": f"prune target x{ctx.prune_scale:.2f}, {nonemb:,} non-embedding params",
                      "dev": dev, "drops": drops, "passed": ok})
        log.info("distill try %d: dev drops %s -> %s", attempt + 1, drops, "pass" if ok else "back off")
        if ok or attempt == c["max_retries"]:
            break
        ctx.prune_scale *= c.get("backoff", 1.2)
        ctx.set_row(*stage_prune(ctx))  # prune less, from the same trimmed model (sets the new prune record)
    if not tries[-1]["passed"]:
        raise gate_failure("distill", ctx, tries)
    rec.metrics = ctx.evaluate(model, ctx.tokenizer, "test")
    rec.extra.update(tries=tries, nonembedding_params=count_params(model, embeddings=False),
                     share_of_teacher_nonembedding=count_params(model, embeddings=False)
                     / count_params(ctx.teacher, embeddings=False),
                     share_of_teacher_total=count_params(model) / count_params(ctx.teacher))
    ctx.model = model
    ctx.save_checkpoint("distill")
    rec.seconds = time.perf_counter() - t0
    return ctx.stage_row("distill", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds), rec


def quantize_config(ctx: Context, **over):
    from edgekit.converters.quantize_executorch import QuantizeConfig

    return QuantizeConfig(**{**ctx.target.quantize, **ctx.cfg.quantize, **over})


def _calibration(ctx: Context, n: int, decoding: bool) -> list[list[np.ndarray]]:
    """Graph inputs for `n` train utterances (a fixed shuffle: every intent is represented)."""
    from edgekit.runtime.predictor import model_inputs

    train = ctx.data.splits["train"]
    idx = np.random.default_rng(ctx.cfg.seed).permutation(len(train))[:n]
    return [model_inputs(ctx.tokenizer.encode(train[i].text, ctx.max_len), len(ctx.data.intents), decoding,
                         reject=False) for i in idx]


def _quantize(ctx: Context, cfg, evaluate=None):
    from edgekit.converters.quantize_executorch import calibration_batches, quantize_executorch

    calib = calibration_batches(_calibration(ctx, cfg.calib_samples, False))
    return quantize_executorch(ctx.model, cfg, calib, evaluate, log=log.info)


def stage_quantize(ctx: Context) -> tuple[dict, PassRecord]:
    """INT8 for XNNPACK (PT2E, calibrated, 4/8-bit embeddings), with FP32 fallback of the most sensitive layers
    while dev drops more than the profile's [quantize] budget against the FP32 model. ONNX Runtime's own INT8
    pass (quantize_onnx) runs on the exported ONNX graph in the export stage, with the same calibration."""
    cfg = quantize_config(ctx)
    fp32 = ctx.model

    def dev(m):
        return ctx.evaluate(m, ctx.tokenizer, "dev")

    q, rec = _quantize(ctx, cfg, dev)
    rec.metrics = ctx.evaluate(q, ctx.tokenizer, "test")
    rec.params_after = count_params(fp32)
    ctx.cache["fp32_model"], ctx.model = fp32, q
    return ctx.stage_row("quantize", rec.metrics, rec.params_after, rec.bytes_after, rec.seconds), rec


STAGE_FUNCS = {"teacher": stage_teacher, "trim_vocab": stage_trim_vocab, "prune": stage_prune,
               "distill": stage_distill, "quantize": stage_quantize, "export": stage_export, "fuse": stage_fuse,
               "package": stage_package}


def report(ctx: Context) -> dict:
    return {"edgekit": __version__, "task": ctx.cfg.task, "target": ctx.target.name,
            "dataset": {**ctx.data.summary(), "lengths": ctx.length_stats}, "stages": ctx.rows,
            "package": ctx.package, "latency": ctx.latency, "compress": ctx.compress or None,
            "budget": ctx.target.budget,
            "quant_layers": next((r["extra"]["quant_layers"] for r in ctx.records if r["name"] == "quantize"), None),
            "passes": ctx.records}


def _save_state(ctx: Context) -> None:
    write_json(ctx.ckpt_dir / STATE, {
        "done": ctx.done, "rows": ctx.rows, "records": ctx.records, "latency": ctx.latency, "package": ctx.package,
        "max_len": ctx.max_len, "data": ctx.cfg.data, "teacher_dev": ctx.teacher_dev,
        "prune_scale": ctx.prune_scale, **ctx.checkpoint})


def _restore(ctx: Context, state: dict) -> None:
    """Take back the stages that completed in the order this build runs them, and the latest model."""
    done = []  # the longest common prefix of this build's stage list and the completed one
    for name, was in zip(ctx.stages, state["done"]):
        if name != was:
            break
        done.append(name)
    ctx.done = done
    ctx.rows = [r for r in state["rows"] if r["name"] in done]
    ctx.records = [r for r in state["records"] if r["name"] in done]
    ctx.latency, ctx.package = (state.get("latency", {}), state.get("package", {})) if "package" in done else ({}, {})
    ctx.teacher_dev, ctx.prune_scale = state.get("teacher_dev", {}), state.get("prune_scale", 1.0)
    if done:
        ctx.teacher = load_model(ctx.ckpt_dir / "teacher.safetensors")
        ctx.teacher_tokenizer = SentencePieceTokenizer.from_file(ctx.ckpt_dir / "teacher.tokenizer.model")
        last = [n for n in done if (ctx.ckpt_dir / f"{n}.safetensors").is_file()][-1]
        ctx.model = load_model(ctx.ckpt_dir / f"{last}.safetensors")
        ctx.tokenizer = SentencePieceTokenizer.from_file(ctx.ckpt_dir / f"{last}.tokenizer.model")
        ctx.checkpoint = {"model": f"{last}.safetensors", "tokenizer": f"{last}.tokenizer.model"}
        if not ctx.teacher_dev:
            ctx.teacher_dev = ctx.evaluate(ctx.teacher, ctx.teacher_tokenizer, "dev")
        if "quantize" in done:  # no checkpoint of its own: the same calibration redone with the recorded fallbacks
            qrec = next(r for r in ctx.records if r["name"] == "quantize")["extra"]
            keep = [f["layer"] for f in qrec["fp32_layers"]]
            ctx.cache["fp32_model"] = ctx.model
            ctx.model, _ = _quantize(ctx, quantize_config(ctx, keep_fp32=keep, weight4=qrec.get("weight4_layers", []),
                                                          max_fallback=0))


def compress_settings(cfg: BuildConfig, target: Target) -> dict:
    """Defaults, then the profile's [compress] table, then the build's overrides."""
    c = {**COMPRESS_DEFAULTS, **target.compress, **{k: v for k, v in cfg.compress.items() if v is not None}}
    if c["vocab_budget"] == 0:
        c["vocab_budget"] = None
    return c


def prepare(cfg: BuildConfig) -> Context:
    """Check every input before any work: target, data, base model, tokenizer, sequence length."""
    target = load_target(cfg.target)
    data = load_dataset(cfg.data, cfg.format, cfg.seed)
    base = _base_model_dir(cfg)
    if not (base / "vocab.txt").is_file():
        raise EdgekitError(f"{base / 'vocab.txt'}: missing; the base model folder needs a WordPiece vocab.txt")
    if cfg.vocab_corpus and not Path(cfg.vocab_corpus).is_file():
        raise EdgekitError(f"{cfg.vocab_corpus}: --vocab-corpus file not found")
    tokenizer, rows = from_wordpiece(WordPieceTokenizer.from_file(base / "vocab.txt").vocab)
    texts = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    hf = json.loads((base / "config.json").read_text()) if (base / "config.json").is_file() else {}
    max_len, stats = choose_max_len(tokenizer, texts, hf.get("max_position_embeddings", 512), target.bucket_percentiles)
    if cfg.max_len:
        max_len = stats["max_len"] = cfg.max_len
    # shorter fixed lengths for ExecuTorch; --buckets overrides the profile's percentiles
    stats["buckets"] = sorted({b for b in (stats["buckets"] if cfg.buckets is None else cfg.buckets) if b < max_len})
    unknown = [i for i in cfg.intents or [] if i not in data.intents]
    if unknown:
        raise EdgekitError(f"--intents: unknown intent {unknown[0]!r}; {cfg.data} has: {', '.join(data.intents)}")
    stages = list(cfg.stages or target.stages)
    ctx = Context(cfg, target, data, tokenizer, Path(cfg.out), max_len, stats, base_rows=rows, stages=stages)
    if any(s in stages for s in ("trim_vocab", "prune", "distill")):
        ctx.compress = compress_settings(cfg, target)
    return ctx


def build(cfg: BuildConfig, on_stage=None) -> dict:
    """Run the stages; returns report.json's content. `on_stage(name, row)` is called after each stage."""
    from edgekit.runtime.backends import set_threads

    tune_allocator()
    ctx = prepare(cfg)
    ctx.out.mkdir(parents=True, exist_ok=True)
    # XNNPACK's pool size can only be set before the first program loads; latency is measured on it.
    set_threads(ctx.target.bench_threads)
    state_file = ctx.ckpt_dir / STATE
    if cfg.resume and state_file.is_file():
        state = json.loads(state_file.read_text())
        if state.get("max_len") != ctx.max_len:
            raise EdgekitError(f"{state_file}: built with max_len {state.get('max_len')}, now {ctx.max_len}; "
                               "rerun without --resume")
        _restore(ctx, state)
        log.info("resuming after stages: %s", ", ".join(ctx.done) or "none")
    elif ctx.ckpt_dir.exists():
        shutil.rmtree(ctx.ckpt_dir)
    for name in ctx.stages[len(ctx.done):]:  # after the stages that completed in order, everything runs again
        log.info("stage %s", name)
        seed_everything(cfg.seed)  # each stage starts from the same state, whichever stages ran before it
        try:
            row, rec = STAGE_FUNCS[name](ctx)
        except ValueError as e:  # a pass config that cannot hold for this data (e.g. a budget below its floor)
            raise EdgekitError(f"stage {name}: {e}") from None
        ctx.set_row(row, rec)
        ctx.done.append(name)
        _save_state(ctx)
        rep = report(ctx)
        write_json(ctx.out / "report.json", rep)
        write_text(ctx.out / "report.md", render_markdown(rep))
        if on_stage:
            on_stage(name, row)
    return report(ctx)
