"""Run an exported model through the same C++ runtimes an app ships: ExecuTorch and ONNX Runtime.

Both are imported lazily, and both load a model from bytes held in memory, never from a mapping of the file: a
file truncated or rewritten under a mapping is a SIGBUS in the next call (docs/guarantees.md). XNNPACK's thread
pool is process-wide and cannot change once a program is loaded (the loaded delegates keep the pool they were made
with), so `set_threads` guards that, and every native step that touches the pool or loads a program runs under
one lock.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgekit.runtime.package import RUNTIMES, PackageError

_ET_THREADS: int | None = None  # the pool's size, once this module has set it
_ET_LOADED = False  # a program is loaded: the pool is fixed from now on
_ET = None  # ExecuTorch's native runtime module, once loaded (executorch_native)
_ET_QUANTIZED = ""  # why the quantized kernels could not be loaded, if they could not
# One lock for every ExecuTorch step that is not a method call: the native init, the pool's reset, program and
# method loads. Resetting the pool while another thread loaded a program hung the process (issue 55: 3 of 20 runs
# of 16 threads). The wait is bounded: a load that never returned would otherwise hang every later open too.
_ET_LOCK = threading.Lock()
LOCK_WAIT_S = 120.0


class ThreadsError(ValueError):
    """A thread count ExecuTorch's process-wide pool cannot take now: the caller's value, not the package's fault."""


class _Locked:
    """`with _Locked():` holds _ET_LOCK, or raises PackageError after LOCK_WAIT_S instead of waiting forever."""

    def __enter__(self):
        if not _ET_LOCK.acquire(timeout=LOCK_WAIT_S):
            raise PackageError(f"ExecuTorch: another thread has held its load lock for over {LOCK_WAIT_S:g} s")

    def __exit__(self, *exc):
        _ET_LOCK.release()


def executorch_native():
    """ExecuTorch's C++ runtime as an app links it: the pybindings' native module itself, with the quantized
    kernels library (the INT8 packages' embedding lookups) loaded beside it, and torch for the tensors in and out.

    Not `executorch.runtime`: its Python wrapper imports the exporter (executorch.exir) and torchao, 10.7 s of a
    cold start against 2.5 s here (measured 2026-12-02 on the 2-core CI machine), and the same C++ runs either way."""
    global _ET, _ET_QUANTIZED
    with _Locked():
        if _ET is None:
            import ctypes

            import torch  # noqa: F401  (the method takes and returns torch tensors)
            from executorch.extension.pybindings import _portable_lib

            # The kernels register themselves with the runtime on load (static initialisers), as when an app links
            # `quantized_ops_lib`. Loaded as torch.ops.load_library loads it (RTLD_LOCAL: it finds the runtime
            # through its own RUNPATH), from beside this very runtime. Without it FP32 packages still run; an INT8
            # one then fails to load, and its error says why.
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
def _quiet():
    """fd 2 sent to /dev/null, under _ET_LOCK only. ExecuTorch prints to fd 2 from C++ (CPU probing when its pool is
    first made, each reset, a load's verification failure before the error it raises), past Python's sys.stderr,
    so only fd 2 itself can quiet it. Under the lock no two swaps interleave (interleaved swaps left fd 2 on
    /dev/null for good: 17 of 20 runs); another thread's own writes to fd 2 during a load (milliseconds) are lost.
    EDGEKIT_NATIVE_LOGS=1 keeps them all; a process without an fd 2 is left as it is."""
    assert _ET_LOCK.locked()
    try:
        saved = None if os.environ.get("EDGEKIT_NATIVE_LOGS") else os.dup(2)
    except OSError:  # fd 2 closed (a daemon): nothing to quiet
        saved = None
    if saved is None:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _fix_pool(et, n: int | None) -> None:
    """Under _ET_LOCK: the pool at n threads (None: as it is; 1 before the first load, the phone-like default for
    one utterance). ThreadsError once a program is loaded and n is another count: the programs loaded keep the pool
    they were made with."""
    global _ET_THREADS
    if _ET_THREADS is None or (n is not None and n != _ET_THREADS):
        if _ET_LOADED:
            raise ThreadsError(f"threads: ExecuTorch's thread pool is process-wide and holds {_ET_THREADS} since a "
                               f"program was loaded; it cannot become {n} (open with threads={_ET_THREADS} or None)")
        want = 1 if n is None else n
        with _quiet():
            et._unsafe_reset_threadpool(want)
        _ET_THREADS = want


def set_threads(n: int) -> None:
    """Set XNNPACK's thread pool size for this process. Only allowed before any .pte is loaded (ThreadsError, a
    ValueError, after, unless n is already the pool's size)."""
    et = executorch_native()  # outside the lock: a loader message must reach the user
    with _Locked():
        _fix_pool(et, n)


def et_threads() -> int | None:
    """The thread count ExecuTorch's own pool reports (None before edgekit has set it)."""
    if _ET_THREADS is None:
        return None
    return int(executorch_native()._threadpool_get_thread_count())


def load_program(src: str | Path | bytes, threads: int | None = None):
    """A `.pte`'s (program, bytes) from its path or bytes (a path is read whole: no loader maps a file), its methods
    not loaded (their metadata readable). The pool is fixed first, in the same hold of the lock, so that no other
    open changes it in between (ThreadsError). The loader verifies the program's structure (InternalConsistency):
    a damaged file is its RuntimeError here, never a crash later. Keep the bytes as long as the program: it runs
    from them."""
    global _ET_LOADED
    et = executorch_native()
    data = src if isinstance(src, bytes) else Path(src).read_bytes()
    with _Locked():
        _fix_pool(et, threads)
        with _quiet():
            program = et._load_program_from_buffer(data, enable_etdump=False, debug_buffer_size=0,
                                                   program_verification=et.Verification.InternalConsistency)
        _ET_LOADED = True  # after the load: a file that fails to load leaves the pool free
    return program, data


class ExecuTorchBackend:
    """A `.pte` method run by ExecuTorch's C++ runtime (XNNPACK delegate plus portable and quantized kernels), loaded
    from the file's bytes (a path is read whole first). name: the file's name in messages (default: the path's)."""

    name = "executorch"

    def __init__(self, src: str | Path | bytes, method: str = "forward", shared: "ExecuTorchBackend | None" = None,
                 threads: int | None = None, file: str | None = None):
        self.file = file or (Path(src).name if not isinstance(src, bytes) else "model.pte")
        # `shared`: the backend of another method of the same loaded .pte (length buckets)
        try:
            self.program, self._bytes = (shared.program, shared._bytes) if shared else load_program(src, threads)
            with _Locked(), _quiet():
                self.method = self.program.load_method(method)
        except ThreadsError:
            raise
        except (RuntimeError, ValueError) as e:
            why = f"; {_ET_QUANTIZED}" if _ET_QUANTIZED else ""
            raise PackageError(f"{self.file}: ExecuTorch cannot load {method!r} ({_first_line(e)}{why})") from None

    @property
    def threads(self) -> int | None:
        """The pool's thread count, as ExecuTorch reports it."""
        return et_threads()

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

    def __init__(self, path: str | Path | bytes, threads: int = 1, providers: list[str] | None = None,
                 serve: dict | None = None, max_len: int = 64, n_intents: int = 2, dynamic_seq: bool = False,
                 spin: bool = True, disabled_optimizers: list[str] | None = None, file: str | None = None):
        import onnxruntime as ort

        from edgekit.runtime.providers import check_ran, choose

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        chosen = choose(providers or ["cpu"], serve, max_len, n_intents, dynamic_seq)
        self.dynamic_seq = dynamic_seq
        self.file = file or (Path(path).name if not isinstance(path, bytes) else "model.onnx")
        try:  # from bytes as given (a package's, held since its sha256 was checked), else the file
            self.session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), so,
                                                providers=[p for p, _ in chosen],
                                                provider_options=[o for _, o in chosen],
                                                disabled_optimizers=disabled_optimizers or [])
            # The Python wrapper keeps the bytes it was given (for a provider reset, which edgekit never asks) while
            # the session holds its own parsed copy: dropped, an open costs the model's size once, not twice.
            self.session._model_bytes = None
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

    @property
    def threads(self) -> int | None:
        """The threads its graphs run on (one pool for all of them on ExecuTorch)."""
        return getattr(self.runners[self.lengths[-1]], "threads", None)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Inputs at the package's full length (attention_mask second, as in the manifest)."""
        L = pick_bucket(self.lengths, int(inputs[1].sum()))
        return self.runners[L].run(*(inputs if L == inputs[0].shape[1] else fit(inputs, L)))


BACKENDS = {b.name: b for b in (ExecuTorchBackend, OnnxBackend)}
assert tuple(BACKENDS) == RUNTIMES, "a backend per runtime name (package.RUNTIMES)"


def open_backend(runtime: str, src: str | Path | bytes, threads: int | None = 1, buckets: list[dict] | None = None,
                 file: str | None = None, **onnx):
    """The runtime's backend for a model (its path, or its bytes with `file` its name in messages). ExecuTorch's
    thread count is process-wide (set_threads; None keeps the pool as it is); ONNX Runtime's is per session (None:
    1). buckets: the manifest's [{"max_len", "method"}] for a .pte with one method per length. onnx: OnnxBackend's
    providers, serve and max_len."""
    if runtime != "executorch":
        return BACKENDS[runtime](src, threads or 1, file=file, **onnx)
    if not buckets or len(buckets) < 2:
        return ExecuTorchBackend(src, threads=threads, file=file)
    first = ExecuTorchBackend(src, buckets[0]["method"], threads=threads, file=file)
    return Bucketed({b["max_len"]: ExecuTorchBackend(src, b["method"], first, file=file) if k else first
                     for k, b in enumerate(buckets)})
