"""Cache keys: what a stage's output depends on, hashed (edgekit.engine.cache.stage_key).

A stage's key is its name, the settings it reads and the build facts in its spec (edgekit.engine.registry), and
its input's key: the previous stage's output key, or for the first stage a digest of the data and the base model
(input_digest: the parsed splits by role, the data files by relative path, the base model's files).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from edgekit.data.dataset import SPLITS, Dataset
from edgekit.engine.cache import digest_files, stage_key, walk_files
from edgekit.engine.context import Context
from edgekit.engine.registry import STAGES

TOOLCHAIN = ("torch", "torchao", "executorch", "onnx", "onnxruntime")  # what quantize and the exporters run on
# The form of the graph edgekit hands the exporters: a cached export (and its recorded metrics) made in an older form
# is rebuilt. 2: attention and word pooling as bmm, LayerNorm without squeeze (one XNNPACK delegate a layer).
LOWERING = 2


def toolchain() -> dict:
    """The installed versions of the libraries that quantize and export (onnxruntime-gpu when present), and the
    form of the graph edgekit gives them."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"edgekit_lowering": LOWERING}
    for name in TOOLCHAIN + ("onnxruntime-gpu",):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _vocab_corpus(ctx: Context) -> dict:
    corpus = ctx.settings.compress.vocab_corpus  # the file's content, not only its path
    return {"vocab_corpus": digest_files([Path(corpus)])} if corpus else {}


def _assistant(ctx: Context) -> dict:
    """distill.assistant: the teacher learns from distill.teacher (its key) with these settings; nothing when off,
    so that the teacher's key is the one it had before the setting existed."""
    d = ctx.settings.distill
    if not (d.assistant and ctx.strong is not None):
        return {}
    names = ("assistant_epochs", "assistant_lr", "temperature", "alpha", "augment", "word_noise", "novel")
    return {"assistant": {n: getattr(d, n) for n in names}, "strong_teacher": ctx.strong.key}


def _unlabelled(ctx: Context) -> dict:
    d = ctx.settings.distill  # the file's content, not only its path
    return {"unlabelled": [digest_files([Path(d.unlabelled)]), d.unlabelled_max]} if d.unlabelled else {}


# A spec's build facts (StageSpec.facts) -> what they add to its key.
FACTS = {
    "vocab_corpus": _vocab_corpus,
    "assistant": _assistant,
    "unlabelled": _unlabelled,
    "toolchain": lambda ctx: {"toolchain": toolchain()},
    "runtimes": lambda ctx: {"runtimes": ctx.target.runtimes, "primary": ctx.target.primary_runtime,
                             "buckets": ctx.length_stats["buckets"]},
    "bench": lambda ctx: {"threads": ctx.target.bench_threads, "profile": ctx.target.name},
    # distill.teacher's own key (its recipe, base model and data); nothing when the build's teacher teaches
    "strong_teacher": lambda ctx: {"strong_teacher": ctx.strong.key} if ctx.strong is not None else {},
    "schema": lambda ctx: {"schema_version": _schema_version()},
    # with out-of-scope data the gates judge intent accuracy with rejection on, at the threshold budget's operating
    # point (gating.gate): a stage gated the older way or under another budget is gated again (distill's tries come
    # from the cache); other data keeps its keys
    "gate": lambda ctx: {"gate": "rejecting", "oos_max_drop_pts": ctx.settings.decoding.oos_max_drop_pts}
    if ctx.data.oos_label is not None else {},
}


def _schema_version() -> int:
    from edgekit.runtime.package import SCHEMA_VERSION  # the graph's outputs follow it (schema 4: path_confidence)

    return SCHEMA_VERSION


def key_of(ctx: Context, name: str, input_key: str) -> str:
    """The stage's cache key: its name, the settings it reads, the build facts it depends on, its input's key."""
    facts = {"task": ctx.cfg.task, "seed": ctx.cfg.seed, "intents": ctx.cfg.intents, "format": ctx.data.format,
             "max_len": ctx.max_len}
    for fact in STAGES[name].facts:
        facts.update(FACTS[fact](ctx))
    return stage_key(name, {"settings": ctx.settings.read_by(name), "facts": facts}, input_key)


def build_outputs() -> frozenset[str]:
    """The names a build writes at the top of OUT: the package's files and the report with its plots."""
    from edgekit.engine.stages.package import OWNED
    from edgekit.reporting.plots import PLOTS
    from edgekit.runtime.package import MANIFEST, REPORTS

    return frozenset({MANIFEST, *REPORTS, *OWNED, *PLOTS.values()})


def data_files(path: str, out: str) -> list[Path]:
    """The files the data key digests: every file of the data (a file, or a folder's files, links followed), whatever
    OUT is. Left out are only what a build writes, so that a rebuild still hits the cache: all of OUT when it sits
    inside the data folder; when OUT is the data folder itself, the build's own files at its top (build_outputs).
    When OUT contains the data folder, nothing of the data is OUT's own. OUT and the data folder are compared both
    as written and with links resolved (OUT may be reached through a link inside the data folder)."""
    p = Path(path)
    if p.is_file():
        return [p]
    files = walk_files(p)
    outs, roots = _names(Path(out)), _names(p)
    if outs & roots:
        own = build_outputs()
        return [x for x in files if not (x.parent == p and x.name in own)]
    if any(o.is_relative_to(r) for o in outs for r in roots):  # OUT inside the data folder: none of it is data
        return [x for x in files if not any(y.is_relative_to(o) for y in _names(x) for o in outs)]
    return files


def _names(p: Path) -> set[Path]:
    """A path as written (made absolute) and with its links resolved."""
    return {Path(os.path.abspath(p)), p.resolve()}


def splits_digest(data: Dataset) -> str:
    """sha256 of what the build trains, tunes and tests on: each split under its role (train, dev, test), its
    examples in order (words, slot tags, intent), splits drawn from train included. So the key follows the parse,
    not only the bytes: a folder renamed from test/ to dev/, or a split column assigned otherwise, is other data."""
    h = hashlib.sha256()
    for role in SPLITS:
        examples = data.splits.get(role, [])
        h.update(json.dumps([role, len(examples)]).encode() + b"\n")
        for ex in examples:
            h.update(json.dumps([ex.words, ex.tags, ex.intent], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def input_digest(data: Dataset, out: str, base: Path, specials: dict | None = None) -> str:
    """The first stage's input key: the data's parsed splits by role (splits_digest); each data file by its path
    relative to the data folder (a data file alone: by its name), with its size and bytes; the base model's
    config.json, model.safetensors and vocab.txt; and the special pieces where they are not BERT's (they decide
    which rows [CLS] and [SEP] read)."""
    from edgekit.text.wordpiece import BERT_SPECIALS

    path = Path(data.source)
    root = path if path.is_dir() else path.parent
    base_files = [base / n for n in ("config.json", "model.safetensors", "vocab.txt")]
    parts = {"splits": splits_digest(data), "files": digest_files(data_files(data.source, out), root),
             "base": digest_files(base_files)}
    if specials not in (None, BERT_SPECIALS):
        parts["specials"] = specials
    return stage_key("input", parts, "")
