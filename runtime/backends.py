"""Run an exported model through the same C++ runtimes an app ships: ExecuTorch and ONNX Runtime.

Both are imported lazily. XNNPACK's thread count is process-wide and can only be set before the first
ExecuTorch program is loaded (setting it later aborts the process), so `set_threads` guards that.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgekit.runtime.package import RUNTIMES, PackageError

_ET_THREADS: int | None = None
_ET_LOADED = False
_ET = None  # ExecuTorch's native runtime module, once loaded (executorch_native)
_ET_QUANTIZED = ""  # why the quantized kernels could not be loaded, if they could not


def executorch_native():
    """ExecuTorch's C++ runtime as an app links it: the pybindings' native module itself, with the quantized
    kernels library (the INT8 packages' embedding lookups) loaded beside it, and torch for the tensors in and out.

    Not `executorch.runtime`: its Python wrapper imports the exporter (executorch.exir) and torchao, 10.7 s of a
    cold start against 2.5 s here (measured 2026-12-02 on the 2-core CI machine), and the same C++ runs either way."""
    global _ET, _ET_QUANTIZED
    if _ET is None:
        import ctypes

        import torch  # noqa: F401  (the method takes and returns torch tensors)
        from executorch.extension.pybindings import _portable_lib

        # The kernels register themselves with the runtime on load (static initialisers), as when an app links
        # `quantized_ops_lib`. Loaded as torch.ops.load_library loads it (RTLD_LOCAL: it finds the runtime through
        # its own RUNPATH), from beside this very runtime. Without it FP32 packages still run; an INT8 one then
        # fails to load, and its error says why.
        where = Path(_portable_lib.__file__).parents[2] / "kernels" / "quantized"
        libs = sorted(where.glob("*quantized_ops_aot_lib.*"))
        try:
            if len(libs) != 1:
                raise OSError(f"no quantized_ops_aot_lib in {where}")
            ctypes.CDLL(str(libs[0]))
        except OSError as e:
            _ET_QUANTIZED = f"ExecuTorch's quantized kernels are not loaded ({e})"
        _ET = _portable_lib
    return _ET
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
    et = executorch_native()  # outside the quiet block: a loader message must reach the user
    with _quiet_native_stderr():
        et._unsafe_reset_threadpool(n)
    _ET_THREADS = n


def load_program(path: str | Path):
    """A `.pte`'s program, its methods not loaded (their metadata readable), the thread pool fixed first: XNNPACK's
    pool cannot change once a program is loaded (set_threads)."""
    global _ET_LOADED
    et = executorch_native()
    if _ET_THREADS is None:
        set_threads(1)
    _ET_LOADED = True
    with _quiet_native_stderr():
        return et._load_program(str(path), enable_etdump=False, debug_buffer_size=0,
                                program_verification=et.Verification.InternalConsistency)


def et_threads() -> int | None:
    return _ET_THREADS


class ExecuTorchBackend:
    """A `.pte` method run by ExecuTorch's C++ runtime (XNNPACK delegate plus portable and quantized kernels)."""

    name = "executorch"

    def __init__(self, path: str | Path, method: str = "forward", program=None):
        global _ET_LOADED
        et = executorch_native()
        if _ET_THREADS is None:
            set_threads(1)  # single-utterance inference: one thread is the phone-like default
        _ET_LOADED = True
        self.file = Path(path).name
        # `program`: another method of an already loaded .pte (length buckets). The loader verifies the program's
        # structure (InternalConsistency), so a damaged file is an error here, never a crash later.
        try:
            with _quiet_native_stderr():
                self.program = program or et._load_program(
                    str(path), enable_etdump=False, debug_buffer_size=0,
                    program_verification=et.Verification.InternalConsistency)
                self.method = self.program.load_method(method)
        except (RuntimeError, ValueError) as e:
            why = f"; {_ET_QUANTIZED}" if _ET_QUANTIZED else ""
            raise PackageError(f"{self.file}: ExecuTorch cannot load {method!r} ({_first_line(e)}{why})") from None

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs in the graph's order (see the manifest's `inputs`)."""
        import torch

        try:
            outs = self.method([torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
        except RuntimeError as e:  # a program that loads but cannot run (e.g. damaged tensor metadata)
            raise PackageError(f"{self.file}: ExecuTorch cannot run it ({_first_line(e)})") from None
        return [o.numpy() for o in outs]


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


class OnnxBackend:
    """An `.onnx` model run by ONNX Runtime. providers: short names tried in order (edgekit.runtime.providers;
    default CPU); `provider` is the one that runs. On CUDA the inputs and outputs go through IO binding.
    dynamic_seq: the graph's sequence axis is dynamic (the manifest's `seq_axis`): each call's input_ids and
    attention_mask are cut to its longest utterance, so a short batch does not pay for the package's max_len.
    spin: the intra-op threads spin-wait between calls (ORT's default). Off where other processes share the cores,
    as on a server: the spinning takes the cores its proxy and request handling need.
    disabled_optimizers: ONNX Runtime graph optimizers not to run at load (the manifest's
    `onnx_disabled_optimizers`: a fusion the build left out on purpose stays out)."""

    name = "onnx"

    def __init__(self, path: str | Path, threads: int = 1, providers: list[str] | None = None,
                 serve: dict | None = None, max_len: int = 64, n_intents: int = 2, dynamic_seq: bool = False,
                 spin: bool = True, disabled_optimizers: list[str] | None = None):
        import onnxruntime as ort

        from edgekit.runtime.providers import check_ran, choose

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        chosen = choose(providers or ["cpu"], serve, max_len, n_intents, dynamic_seq)
        self.dynamic_seq, self.file = dynamic_seq, Path(path).name
        try:
            self.session = ort.InferenceSession(str(path), so, providers=[p for p, _ in chosen],
                                                provider_options=[o for _, o in chosen],
                                                disabled_optimizers=disabled_optimizers or [])
        except Exception as e:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...) share no base
            if type(e).__module__.startswith("onnxruntime"):
                raise PackageError(f"{self.file}: ONNX Runtime cannot load it ({_first_line(e)})") from None
            raise
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.threads, self.provider = threads, self.session.get_providers()[0]
        check_ran(chosen[0][0], self.provider)
        self.binding = self.session.io_binding() if self.provider != "CPUExecutionProvider" else None

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs in the graph's order (see the manifest's `inputs`)."""
        if self.dynamic_seq:
            inputs = cut(inputs)
        try:
            if self.binding is None:
                return self.session.run(None, dict(zip(self.input_names, inputs)))
            return self._run_bound(inputs)
        except Exception as e:  # onnxruntime's own exception types (InvalidArgument, Fail, ...) share no base
            if isinstance(e, RuntimeError) or type(e).__module__.startswith("onnxruntime"):
                raise PackageError(f"{self.file}: ONNX Runtime cannot run it ({_first_line(e)})") from None
            raise

    def _run_bound(self, inputs) -> list[np.ndarray]:
        """One run through IO binding (a GPU provider): inputs copied in, outputs copied back to the CPU."""
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        for name, a in zip(self.input_names, inputs):
            b.bind_cpu_input(name, np.ascontiguousarray(a))
        for name in self.output_names:
            b.bind_output(name, "cpu")
        self.session.run_with_iobinding(b)
        return b.copy_outputs_to_cpu()


def cut(inputs) -> list[np.ndarray]:
    """A dynamic sequence axis: input_ids and attention_mask ((B, T), first and second) cut to the batch's longest
    utterance, at least 3 positions ([CLS], a piece, [SEP]); the word positions keep the package's length."""
    n = max(3, int(inputs[1].sum(-1).max()))
    return inputs if n == inputs[0].shape[1] else [inputs[0][:, :n], inputs[1][:, :n], *inputs[2:]]


def fit(inputs, length: int) -> list[np.ndarray]:
    """Cut a graph's inputs, made at the package's full length T, to a bucket of `length`: the (1, T) sequences
    to (1, length) and the (1, T - 2) word positions to (1, length - 2). What is cut is padding when the
    utterance has at most `length` pieces."""
    T = inputs[0].shape[1]
    return [a[:, : a.shape[1] - (T - length)] if a.ndim == 2 and a.shape[1] in (T, T - 2) else a for a in inputs]


def pick_bucket(lengths: list[int], n_pieces: int) -> int:
    """The shortest of the sorted `lengths` that holds `n_pieces` (the longest when none does: truncated)."""
    return next((L for L in lengths if L >= n_pieces), lengths[-1])


class Bucketed:
    """One model exported at several fixed lengths (length buckets): each call runs the shortest graph that
    holds the utterance, so that short utterances do not pay for the longest one's padding."""

    def __init__(self, runners: dict[int, object]):
        self.runners, self.lengths = runners, sorted(runners)
        self.name = runners[self.lengths[-1]].name

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs at the package's full length (attention_mask second, as in the manifest)."""
        L = pick_bucket(self.lengths, int(inputs[1].sum()))
        return self.runners[L].run(*(inputs if L == inputs[0].shape[1] else fit(inputs, L)))


BACKENDS = {b.name: b for b in (ExecuTorchBackend, OnnxBackend)}
assert tuple(BACKENDS) == RUNTIMES, "a backend per runtime name (package.RUNTIMES)"


def open_backend(runtime: str, path: str | Path, threads: int = 1, buckets: list[dict] | None = None, **onnx):
    """The runtime's backend for `path`. ExecuTorch's thread count is process-wide (set_threads); ONNX Runtime's
    is per session. buckets: the manifest's [{"max_len", "method"}] for a .pte with one method per length.
    onnx: OnnxBackend's providers, serve and max_len."""
    if runtime != "executorch":
        return BACKENDS[runtime](path, threads, **onnx)
    if not buckets or len(buckets) < 2:
        return ExecuTorchBackend(path)
    first = ExecuTorchBackend(path, buckets[0]["method"])
    return Bucketed({b["max_len"]: ExecuTorchBackend(path, b["method"], first.program) if k else first
                     for k, b in enumerate(buckets)})
