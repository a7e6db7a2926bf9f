"""Process-level tuning for CPU training."""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done = False


def tune_allocator() -> bool:
    """Keep large tensors (the 45 MB embedding gradient, activations) on glibc's heap instead of mmap.

    By default each step's big gradient buffers are mmap'd and unmapped, so every step page-faults tens of
    thousands of fresh pages (measured: 35k faults and ~2.7x the step time on 2 cores). With the thresholds
    raised, freed blocks are reused. glibc only; a no-op elsewhere. Returns whether it applied.
    """
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL("libc.so.6")
        _done = bool(libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        _done = False
    return _done


def native_bf16() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (AVX-512 bf16 or AMX): autocast then trains faster
    (measured on SNIPS: docs/experiments.md). Without it, bf16 is emulated and slower than FP32."""
    import torch

    try:  # mkldnn's own bf16 check says yes on any AVX-512 CPU, where bf16 is emulated
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False

