"""Run an exported model through the same C++ runtimes an app ships: ExecuTorch and ONNX Runtime.

Both are imported lazily. XNNPACK's thread count is process-wide and can only be set before the first
ExecuTorch program is loaded (setting it later aborts the process), so `set_threads` guards that.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_ET_THREADS: int | None = None
_ET_LOADED = False


@contextmanager
def _quiet_native_stderr():
    """ExecuTorch's C++ side logs CPU probing to fd 2 at load; keep that off the user's terminal."""
    if os.environ.get("EDGEKIT_NATIVE_LOGS"):
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def set_threads(n: int) -> None:
    """Set XNNPACK's thread pool size for this process. Only allowed before any .pte is loaded."""
    global _ET_THREADS
    if _ET_THREADS == n:
        return
    if _ET_LOADED:
        raise RuntimeError(f"XNNPACK threads are fixed at {_ET_THREADS} once a program is loaded; cannot set {n}")
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    with _quiet_native_stderr():
        _unsafe_reset_threadpool(n)
    _ET_THREADS = n


def et_threads() -> int | None:
    return _ET_THREADS


class ExecuTorchBackend:
    """A `.pte` method run by `executorch.runtime.Runtime` (XNNPACK delegate plus portable kernels)."""

    name = "executorch"

    def __init__(self, path: str | Path, method: str = "forward"):
        global _ET_LOADED
        # The quantized kernels (INT8/4-bit embedding lookups of INT8 packages) live in their own library, as
        # in an app, which links `quantized_ops_lib` beside the portable and XNNPACK ones.
        import executorch.kernels.quantized  # noqa: F401
        from executorch.runtime import Runtime

        if _ET_THREADS is None:
            set_threads(1)  # single-utterance inference: one thread is the phone-like default
        _ET_LOADED = True
        with _quiet_native_stderr():
            self.program = Runtime.get().load_program(Path(path))
            self.method = self.program.load_method(method)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs in the graph's order (see the manifest's `inputs`)."""
        import torch

        outs = self.method.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
        return [o.numpy() for o in outs]


class OnnxBackend:
    """An `.onnx` model run by ONNX Runtime's CPU execution provider."""

    name = "onnx"

    def __init__(self, path: str | Path, threads: int = 1):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.threads = threads

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs in the graph's order (see the manifest's `inputs`)."""
        return self.session.run(None, dict(zip(self.input_names, inputs)))


BACKENDS = {"executorch": ExecuTorchBackend, "onnx": OnnxBackend}


def open_backend(runtime: str, path: str | Path, threads: int = 1):
    """The runtime's backend for `path`. ExecuTorch's thread count is process-wide (set_threads); ONNX Runtime's
    is per session."""
    return BACKENDS[runtime](path) if runtime == "executorch" else BACKENDS[runtime](path, threads)
