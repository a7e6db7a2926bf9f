"""The package's p50 before training (issue 56): a latency model fitted on random-weight exports of a few student
shapes on this machine, so that `--max-latency` picks a shape by arithmetic, as `--max-size` does.

    p50_ms = a + b * layers + c * (layer parameters, millions)

Weights do not change a graph's time, only its shape and precisions. Each probe is a random student of an even
shape (search.even_shape), quantized as the build quantizes it (the same 4-bit and INT8 Linears; random-weight
calibration on real utterances), wrapped in the build's decoding graph, exported with its length buckets, and timed
as the package stage times a package: in a fresh process, on the profile's threads, over the test utterances (cut
by the base tokenizer: trim keeps every task piece of train and dev, so it cuts them as the student's will), the
probes in alternating blocks so that they see the same machine. Two probes per depth (the fewest and the most
layers the levers allow), at the least and the most parameters, fix the coefficients by least squares; with one
depth the layer term folds into `a`, and the fit is exact.

Not modelled: a factorised embedding's projection (r x H a piece: rank 64 is about 1% of a 4-layer student's
time); which heads and channels prune keeps in which layer (the search spreads them evenly); a vocabulary budget,
or test words outside train and dev, which the student cuts into more pieces than the base tokenizer (a longer
input may take a longer bucket). The model is fitted once per machine and settings (a cache entry keyed by the
CPU, threads, versions, base model, lengths, labels, quantize settings and probe shapes), so the same command on
the same machine picks the same shape, and it is recorded in report.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("edgekit")
LATENCY_VERSION = 2  # 2: probes exported in engine.keys.LOWERING 2 (one delegate a layer)
# A shape is taken under a latency budget only with this share of it to spare: the same package's p50 moves by a
# few percent between runs, and the model's fit by as much (its residuals are recorded).
MARGIN = 0.10
PROBE_CALIB = 16  # calibration utterances per probe: ranges do not change a graph's time


@dataclass(frozen=True)
class LatencyModel:
    """p50_ms = a + b * layers + c * params / 1e6, fitted on `points` ({layers, params, p50_ms}) on `cpu`."""

    a: float
    b: float
    c: float
    points: tuple
    cpu: str
    threads: int
    seconds: float = 0.0

    def predict(self, layers: int, params: int) -> float:
        """The p50 (ms) of a student of `layers` layers and `params` layer parameters (heads and FFN)."""
        return self.a + self.b * layers + self.c * params / 1e6

    def max_params(self, layers: int, max_ms: float) -> int:
        """The most layer parameters a `layers`-layer student may keep for a predicted p50 <= max_ms (-1: none)."""
        room = max_ms - self.a - self.b * layers + 1e-9  # a budget equal to a prediction meets it
        if self.c <= 0:
            return 1 << 62 if room >= 0 else -1
        return int(room / self.c * 1e6) if room >= 0 else -1

    def to_dict(self) -> dict:
        """report.json's `search.latency_model`: the coefficients, the probes and each probe's residual (ms)."""
        d = dataclasses.asdict(self)
        d["residual_ms"] = [round(p["p50_ms"] - self.predict(p["layers"], p["params"]), 4) for p in self.points]
        return d


def fit_points(points: list[dict], cpu: str, threads: int, seconds: float = 0.0) -> LatencyModel:
    """Least squares over the probes. A term the probes do not vary (one layer count, or one parameter count) is
    folded into `a` (its coefficient 0): the search then only weighs shapes like the probes in that respect."""
    import numpy as np

    terms = {"b": [p["layers"] for p in points], "c": [p["params"] / 1e6 for p in points]}
    varied = [k for k, v in terms.items() if max(v) - min(v) > 1e-9]
    y = np.array([p["p50_ms"] for p in points])
    while True:
        X = np.array([[1.0] + [terms[k][i] for k in varied] for i in range(len(points))])
        got = dict(zip(["a"] + varied, map(float, np.linalg.lstsq(X, y, rcond=None)[0])))
        negative = [k for k in varied if got[k] < 0]  # a cost below zero is timing noise: that term is dropped
        if not negative:
            break
        varied.remove(negative[0])
    return LatencyModel(got["a"], got.get("b", 0.0), got.get("c", 0.0), tuple(points), cpu, threads,
                        round(seconds, 1))


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's: part of the model's cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def _student(ctx, labels: dict, shape):
    """A random-weight student of `shape` over the base vocabulary (its ids are what the probe is fed)."""
    import torch

    from edgekit.converters.distill import continues_word
    from edgekit.modeling.model import JointModel, ModelConfig, enable_word_pool
    from edgekit.modeling.pretrained import ARCHS, base_config

    hf = base_config(ctx.base_model)
    torch.manual_seed(0)
    n_slots = len(ctx.data.slot_tags)  # as the teacher stage builds it: 0 on intent-only data
    # the architecture's own fields (an MPNet's relative-position bias, token types), the positions cut to max_len
    arch = ARCHS[hf["model_type"]].fields(hf) | {"max_positions": ctx.max_len}
    model = JointModel(ModelConfig(vocab_size=ctx.base_tokenizer.vocab_size, hidden=shape.hidden,
                                   heads=list(shape.heads), ffn=list(shape.ffn), head_dim=shape.head_dim,
                                   eps=hf.get("layer_norm_eps", 1e-12), n_intents=len(labels["intents"]),
                                   n_slots=n_slots, **arch)).eval()
    if ctx.settings.distill.word_pool and n_slots:
        enable_word_pool(model, continues_word(ctx.base_tokenizer))
    return model


def export_probe(ctx, labels: dict, shape, path: Path) -> None:
    """Quantize, wrap and export one random student as the build would (ExecuTorch, the build's buckets)."""
    from edgekit.converters.decoding import DecodingConfig, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.quantize_executorch import calibration_batches, quantize_executorch
    from edgekit.runtime.interface import model_inputs

    q = ctx.settings.quantize
    enc = [ctx.base_tokenizer.encode(ex.text, ctx.max_len) for ex in ctx.data.splits["train"][:PROBE_CALIB]]
    n_int = len(labels["intents"])
    calib = calibration_batches([model_inputs(e, n_int, False, reject=False) for e in enc])
    qm, _ = quantize_executorch(_student(ctx, labels, shape), dataclasses.replace(q, max_fallback=0), calib)
    decoded, _ = with_decoding(qm, DecodingConfig(labels["intents"], labels["slot_tags"], None,
                                                  oos_label=labels.get("oos_label")))
    export_executorch(decoded, ExecuTorchExportConfig(ctx.max_len, ctx.length_stats["buckets"]), path,
                      [model_inputs(e, n_int, True, reject=False) for e in enc[:4]])


def model_key(ctx, labels: dict, shapes) -> str:
    """What the probes' times depend on: the machine, the threads, the shapes, lengths, labels and precisions."""
    from importlib.metadata import version

    from edgekit import __version__
    from edgekit.modeling.pretrained import base_config

    q = ctx.settings.quantize
    blob = {"version": LATENCY_VERSION, "edgekit": __version__, "cpu": cpu_name(), "threads": ctx.target.bench_threads,
            "executorch": version("executorch"), "torch": version("torch"), "torchao": version("torchao"),
            "base": base_config(ctx.base_model), "oos_label": labels.get("oos_label"),
            "tokenizer": hashlib.sha256(ctx.base_tokenizer.model_proto).hexdigest()[:16], "max_len": ctx.max_len,
            "buckets": list(ctx.length_stats["buckets"]), "labels": [len(v) for v in labels.values()
                                                                     if isinstance(v, list)],
            "slots": bool(ctx.data.slot_tags), "word_pool": ctx.settings.distill.word_pool,
            "quantize": {k: getattr(q, k) for k in ("embedding_bits", "embedding_group", "weight4", "keep_fp32")},
            "shapes": [[list(s.heads), list(s.ffn)] for s in shapes],
            "texts": hashlib.sha256("\n".join(bench_texts(ctx)).encode()).hexdigest()[:16]}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:32]


def bench_texts(ctx) -> list[str]:
    """The utterances the package stage times: the first package.bench_utterances of test."""
    return [ex.text for ex in ctx.data.splits["test"][: ctx.settings.package.bench_utterances]]


def latency_model(ctx, labels: dict, shapes: list, params: list[int]) -> tuple[LatencyModel, bool]:
    """(the model, whether it was read from the cache) from probes of `shapes` (sizes.StudentShape), whose layer
    parameters are `params`: exported and timed on a miss."""
    from edgekit.converters.export_executorch import ExecuTorchExportConfig
    from edgekit.errors import EdgekitError
    from edgekit.runtime.backends import set_threads
    from edgekit.tools.bench import in_fresh_process

    key = model_key(ctx, labels, shapes)
    hit = ctx.cache.get("latency", key)
    if hit is not None:
        m = hit.result["model"]
        return LatencyModel(m["a"], m["b"], m["c"], tuple(m["points"]), m["cpu"], m["threads"], m["seconds"]), True
    # each export checks its .pte in this process, which fixes XNNPACK's pool: at the size the build runs with
    set_threads(ctx.target.bench_threads)
    t0, work = time.perf_counter(), ctx.cache.workdir("latency")
    paths = [work / f"probe{k}.pte" for k in range(len(shapes))]
    try:
        for k, (shape, n) in enumerate(zip(shapes, params)):
            log.info("latency model: probe %d of %d, %d layers, %.2f M layer parameters", k + 1, len(shapes),
                     shape.layers, n / 1e6)
            export_probe(ctx, labels, shape, paths[k])
        ctx.base_tokenizer.save(work / "tokenizer.model")
        got = in_fresh_process("probe_latency", paths=[str(p) for p in paths],
                               tokenizer=str(work / "tokenizer.model"), lowercase=ctx.base_tokenizer.lowercase,
                               labels=labels, max_len=ctx.max_len, texts=bench_texts(ctx),
                               buckets=ExecuTorchExportConfig(ctx.max_len, ctx.length_stats["buckets"]).methods(),
                               threads=ctx.target.bench_threads)
    except EdgekitError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    except Exception as e:  # a probe is a random model of a shape the search made: its failure is edgekit's
        shutil.rmtree(work, ignore_errors=True)
        raise EdgekitError(f"latency model: a probe export failed ({type(e).__name__}: {e}); build without "
                           "--max-latency, or report it") from e
    for p in paths + [work / "tokenizer.model"]:
        p.unlink()  # the entry keeps the model, not the probes (tens of MB)
    points = [{"layers": s.layers, "params": n, "p50_ms": round(g["p50_ms"], 4)}
              for s, n, g in zip(shapes, params, got)]
    model = fit_points(points, cpu_name(), ctx.target.bench_threads, time.perf_counter() - t0)
    ctx.cache.put("latency", key, work, {"model": model.to_dict()})
    return model, False
