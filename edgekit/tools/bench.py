"""`edgekit bench`: single-utterance latency of a package, optionally against its FP32 teacher in the same run.

The teacher comes from the build's stage cache (found through OUT/report.json), wrapped in the same
decoding graph and exported the same way (ExecuTorch + XNNPACK, or ONNX, same fixed lengths), FP32. Both are
timed in alternating blocks of 50 utterances on the same real test utterances (`paired_latency`): a shared CPU
drifts by more than a run-to-run comparison could resolve, and alternating single calls would time the small
package with its caches just flushed by the 89 MB teacher (measured: 1.10 ms instead of 0.73 ms p50).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from edgekit.data.dataset import package_split
from edgekit.engine.cache import built_entry
from edgekit.errors import EdgekitError
from edgekit.runtime.package import Package, PackageError
from edgekit.runtime.predictor import Predictor, onnx_options, paired_latency


def export_teacher(package: Path, runtime: str, dest: Path) -> Path:
    """Export the build's FP32 teacher, with the package's decoding graph, for `runtime`; returns the file and
    the teacher's tokenizer."""
    from edgekit.converters.decoding import config_from_record, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
    from edgekit.modeling.model import load_model
    from edgekit.runtime.interface import model_inputs
    from edgekit.runtime.tokenizer import SentencePieceTokenizer

    pkg = Package.load(package)
    built = built_entry(package, ("teacher",))
    if built is None:
        raise EdgekitError(f"{package}: the build's teacher is not in the stage cache (report.json names it); "
                           "--compare-teacher needs the cache the package was built with")
    entry, rep = built
    export = next((r for r in rep["passes"] if r["name"] == "export"), None)
    if export is None:
        raise EdgekitError(f"{package / 'report.json'}: the build has no export record")
    teacher = load_model(entry / "model.safetensors")
    # the package's own decoding graph (its learned transition scores too): the same ops, so latency compares alike
    decoded, _ = with_decoding(teacher, config_from_record(pkg.labels, export["extra"]["decoding"]))
    tok = SentencePieceTokenizer.from_file(entry / "tokenizer.model")
    texts = ["play the latest song by queen", "what is the weather tomorrow", "book a table for two"]
    checks = [model_inputs(tok.encode(t, pkg.max_len), len(pkg.labels["intents"]), True, batched=pkg.batched)
              for t in texts]
    if runtime == "executorch":
        path = dest / "teacher.pte"
        buckets = [b["max_len"] for b in pkg.buckets(runtime) or []][:-1]  # the package's lengths, full one last
        export_executorch(decoded, ExecuTorchExportConfig(pkg.max_len, buckets), path, checks)
    else:
        path = dest / "teacher.onnx"
        # the package's shapes: a server package's batch axis and, when it has one, its dynamic sequence axis
        export_onnx(decoded, OnnxExportConfig(pkg.max_len, batch=pkg.batched,
                                              dynamic_seq=pkg.dynamic_seq), path, checks)
    return path, tok


def bench(package: str | Path, data: str | Path, runtime: str = "executorch", n: int = 200, threads: int = 1,
          compare_teacher: bool = False, split: str = "test", fmt: str | None = None,
          providers: list[str] | None = None) -> dict:
    """p50/p99 of the package's model call on `n` utterances of `split`; with compare_teacher, the FP32 teacher
    exported the same way is timed in the same run and the speed-up (teacher p50 / package p50) reported.
    providers: ONNX Runtime's, tried in order (default: the package's); the one that ran is recorded."""
    from edgekit.runtime.backends import open_backend, set_threads

    package = Path(package)
    set_threads(threads)  # before any program loads (XNNPACK's pool)
    try:
        pkg = Package.load(package)
    except PackageError as e:
        raise EdgekitError(str(e)) from None
    texts = [ex.text for ex in package_split(data, package, split, fmt)[:n]]
    pred = Predictor.open(pkg, runtime, threads=threads, providers=providers)
    out = {"package": str(package), "runtime": runtime, "provider": pred.provider, "threads": threads,
           "runtime_threads": pred.threads,  # as the runtime reports them
           "n": len(texts), "split": split,
           "max_len": pkg.max_len, "package_bytes": sum(f["bytes"] for name, f in pkg.manifest["files"].items()
                                                         if name in (pkg.manifest["models"][runtime],
                                                                     "tokenizer.model", "labels.json"))}
    if not compare_teacher:
        out["package_latency"] = pred.latency(texts)
        return out
    with tempfile.TemporaryDirectory() as tmp:
        path, tok = export_teacher(package, runtime, Path(tmp))
        # the same axes and the same execution providers as the package, or the speed-up would compare them
        same = onnx_options(pkg, providers) if runtime == "onnx" else {}
        backend = open_backend(runtime, path, threads, pkg.buckets(runtime), **same)
        teacher = Predictor(backend, tok, pkg.labels, pkg.max_len, decoding=True, batched=pkg.batched)
        lat, lat_t = paired_latency(pred, teacher, texts, block=50)
        # the build's own teacher (distill.teacher, when set, taught the student but is not what it replaces)
        rep = json.loads((package / "report.json").read_text())
        out["teacher"] = {"base_model": rep.get("config", {}).get("base_model"), "stage": "teacher",
                          "params": next((s["params"] for s in rep.get("stages", []) if s["name"] == "teacher"), None)}
        out.update(package_latency=lat, teacher_latency=lat_t, teacher_bytes=path.stat().st_size,
                   teacher_provider=teacher.provider, speedup_p50=lat_t["p50_ms"] / lat["p50_ms"])
    return out


def decoding_latency(package: str, runtime: str, texts: list[str], threads: int = 1, raw_path: str | None = None,
                     unfused_path: str | None = None) -> dict:
    """{"decoding", "raw", "unfused"} latency: the package's graph, the same model exported without the decoding
    graph (`raw_path`, when the build exported it) and, for ONNX, the package's graph before offline fusion
    (`unfused_path`), timed utterance by utterance in alternation."""
    from edgekit.runtime.backends import open_backend, set_threads
    from edgekit.runtime.predictor import alternating_latency

    set_threads(threads)
    pkg = Package.load(package)
    p = Predictor.open(pkg, runtime, threads=threads)
    preds = {"decoding": p}
    # exported with the same buckets, or the same dynamic sequence axis, which the runtime cuts inputs to; the same
    # ONNX Runtime optimizers left out (the raw graph was optimized as the package's)
    same = ({"dynamic_seq": pkg.dynamic_seq, "disabled_optimizers": pkg.onnx_disabled_optimizers}
            if runtime == "onnx" else {})
    if raw_path:
        preds["raw"] = Predictor(open_backend(runtime, raw_path, threads, pkg.buckets(runtime), **same), p.tokenizer,
                                 p.labels, p.max_len, decoding=False)
    if unfused_path:
        preds["unfused"] = Predictor(open_backend(runtime, unfused_path, threads, pkg.buckets(runtime), **same),
                                     p.tokenizer, p.labels, p.max_len, decoding=True, batched=p.batched,
                                     mask_dtype=p.mask_dtype)
    # Ten rounds (a few seconds): single runs of three rounds moved by several points with the machine's state.
    return dict(zip(preds, alternating_latency(list(preds.values()), texts, rounds=10)))


def probe_latency(paths: list[str], tokenizer: str, lowercase: bool, labels: dict, max_len: int, texts: list[str],
                  buckets: list[dict], threads: int = 1) -> list[dict]:
    """Latency of the latency model's probe graphs (edgekit.engine.latency), each a decoding graph over `tokenizer`'s
    ids, timed over the same utterances in alternating blocks of 50: probes of several sizes, timed one utterance
    each in turn, would each meet caches the last one flushed (see paired_latency)."""
    from edgekit.runtime.backends import open_backend, set_threads
    from edgekit.runtime.predictor import alternating_latency
    from edgekit.runtime.tokenizer import SentencePieceTokenizer

    set_threads(threads)
    tok = SentencePieceTokenizer.from_file(tokenizer, lowercase)
    preds = [Predictor(open_backend("executorch", p, threads, buckets), tok, labels, max_len, decoding=True)
             for p in paths]
    return alternating_latency(preds, texts, rounds=10, block=50)


def batch_throughput(package: str, texts: list[str], batches: list[int], threads: int = 1,
                     providers: list[str] | None = None, rounds: int = 3) -> dict:
    """A batched package's model call at each batch size: p50 ms per batch and utterances per second, on
    batches cut from `texts` in order (every utterance once per round), after one warm-up round. The provider
    that ran is recorded."""
    import time

    from edgekit.runtime.interface import stack
    from edgekit.runtime.latency import percentile

    pred = Predictor.open(package, "onnx", threads=threads, providers=providers)
    if not pred.batched:
        raise EdgekitError(f"{package}: the package's graph takes one utterance per call (a phone profile)")
    xs = [pred.inputs(pred.tokenizer.encode(t, pred.max_len)) for t in texts]
    out = {"provider": pred.provider, "threads": threads}
    for b in batches:
        groups = [stack((xs * (1 + b // len(xs)))[k : k + b]) for k in range(0, max(len(xs), b), b)]
        groups = [g for g in groups if len(g[0]) == b]
        times = []
        for r in range(rounds + 1):
            for g in groups:
                t0 = time.perf_counter()
                pred.backend.run(*g)
                if r:  # round 0 warms up (ONNX Runtime allocates per new shape)
                    times.append((time.perf_counter() - t0) * 1000)
        p50 = percentile(times, 50)  # the rate from the unrounded p50
        out[str(b)] = {"p50_ms": round(p50, 3), "p99_ms": percentile(times, 99, digits=3),
                       "per_second": round(1000 * b / p50, 1), "n": len(times)}
    return out


def in_fresh_process(fn: str, **kwargs):
    """Run `edgekit.tools.bench.<fn>(**kwargs)` in a new Python process and return its result. Latency is measured
    there, as in an app: within a build, the training process's allocator state and thread pools made the same
    package measure 40% slower (SNIPS INT8: 1.31 ms in the build, 0.95 ms in a fresh process)."""
    out = subprocess.run([sys.executable, "-m", "edgekit.tools.bench", fn], input=json.dumps(kwargs),
                         capture_output=True, text=True, check=False)
    if out.returncode:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgekitError(f"latency measurement ({fn}) failed: {tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # python -m edgekit.tools.bench FN < kwargs.json (see in_fresh_process)
    print(json.dumps(globals()[sys.argv[1]](**json.loads(sys.stdin.read()))))
