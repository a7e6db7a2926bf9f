"""ONNX Runtime execution providers by short name, with the options a server profile sets, chosen in order.

A profile lists names (`providers = ["cuda", "cpu"]`); the first whose provider this onnxruntime build has runs
the model. `onnxruntime-gpu` (the `gpu` extra) has CUDA and TensorRT; the plain `onnxruntime` wheel has CPU
only, and then one warning says so. TensorRT cannot parse the fused `com.microsoft` ops of the optimized graph,
so it gets the package's unfused graph (manifest `models.onnx_unfused`) when the package has one.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
from pathlib import Path

log = logging.getLogger("edgekit.runtime")

DEFAULT_MAX_BATCH = 32  # texts per batched call, when a package's `serve` table does not say ([serve] max_batch)
PROVIDERS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
_WARNED: set[tuple] = set()


def provider_options(name: str, serve: dict | None = None, max_len: int = 64, n_intents: int = 2,
                     cache_dir: Path | None = None, dynamic_seq: bool = False) -> dict:
    """Options for one provider. serve: the manifest's `serve` table (num_gpus, gpu_memory_gb, max_batch)."""
    serve = serve or {}
    gb = (serve.get("num_gpus") or 1.0) * serve.get("gpu_memory_gb", 24.0)  # a replica's share of the card
    if name == "cuda":
        return {"gpu_mem_limit": int(gb * (1 << 30)), "arena_extend_strategy": "kSameAsRequested",
                "cudnn_conv_algo_search": "HEURISTIC"}
    if name == "tensorrt":
        b, t = serve.get("max_batch", DEFAULT_MAX_BATCH), max_len
        # one optimization profile over the batch axis of every input, and over the sequence axis of input_ids and
        # attention_mask when it is dynamic (3 to max_len pieces); the word positions keep the package's length
        seq = {"min": 3, "opt": max(3, t // 2), "max": t} if dynamic_seq else {"min": t, "opt": t, "max": t}
        dims = lambda k: {"input_ids": f"x{seq[k]}", "attention_mask": f"x{seq[k]}", "word_pos": f"x{t - 2}",  # noqa: E731
                          "intent_mask": f"x{n_intents}", "reject": ""}
        shapes = lambda n, k: ",".join(f"{name}:{n}{d}" for name, d in dims(k).items())  # noqa: E731
        return {"trt_fp16_enable": True, "trt_max_workspace_size": int(min(gb, 4.0) * (1 << 30)),
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(cache_dir or Path.home() / ".cache" / "edgekit" / "trt"),
                "trt_profile_min_shapes": shapes(1, "min"), "trt_profile_opt_shapes": shapes(max(1, b // 2), "opt"),
                "trt_profile_max_shapes": shapes(b, "max")}
    return {}


def choose(names: list[str], serve: dict | None = None, max_len: int = 64, n_intents: int = 2,
           dynamic_seq: bool = False) -> list[tuple[str, dict]]:
    """(ORT provider, options) for the listed names this onnxruntime has, in order, CPU always last. Warns once
    when a listed GPU provider is missing."""
    import onnxruntime as ort

    have = set(ort.get_available_providers())
    if have & {PROVIDERS["cuda"], PROVIDERS["tensorrt"]} & {PROVIDERS[n] for n in names}:
        _preload_cuda()
    chosen = [(PROVIDERS[n], provider_options(n, serve, max_len, n_intents, dynamic_seq=dynamic_seq))
              for n in names if PROVIDERS[n] in have]
    missing = [n for n in names if PROVIDERS[n] not in have]
    key = tuple(missing)
    if missing and missing != ["cpu"] and key not in _WARNED:
        _WARNED.add(key)
        log.warning("ONNX Runtime here has no %s provider (install the `gpu` extra on a machine with CUDA); "
                    "running on %s", "/".join(missing), chosen[0][0] if chosen else "CPUExecutionProvider")
    if not any(p == PROVIDERS["cpu"] for p, _ in chosen):
        chosen.append((PROVIDERS["cpu"], {}))
    return chosen


@functools.cache
def _preload_cuda() -> None:
    """Load CUDA and cuDNN from their pip wheels when the system has none (onnxruntime-gpu's preload_dlls), once a
    process. It prints each library it misses on stdout, which carries `edgekit predict`'s and `bench`'s JSON: those
    lines become one warning instead."""
    import onnxruntime as ort

    if not hasattr(ort, "preload_dlls"):  # before onnxruntime 1.21
        return
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ort.preload_dlls()
    lines = out.getvalue().splitlines()
    missing = sorted({line.split(":")[0].removeprefix("Failed to load ").strip()
                      for line in lines if line.startswith("Failed to load")})
    for line in lines:  # the rest (versions, the torch note) for whoever turns debug logging on
        if line.strip() and not line.startswith("Failed to load"):
            log.debug("onnxruntime.preload_dlls: %s", line)
    if missing:
        log.warning("ONNX Runtime's CUDA libraries are missing here (%s): the CUDA provider cannot start without "
                    "them (docs/troubleshooting.md)", ", ".join(missing))


def check_ran(wanted: str, ran: str) -> None:
    """Warn once when the session runs on another provider than the first one chosen (ONNX Runtime falls back
    quietly when, e.g., the CUDA libraries fail to load)."""
    if wanted != ran and (wanted, ran) not in _WARNED:
        _WARNED.add((wanted, ran))
        log.warning("ONNX Runtime could not start %s (check the CUDA/cuDNN/TensorRT libraries); running on %s",
                    wanted, ran)


def short_name(provider: str) -> str:
    """'CUDAExecutionProvider' -> 'cuda'."""
    return next((k for k, v in PROVIDERS.items() if v == provider), provider)
