"""Pass: fixed-shape op fusion, applied to the exported artifacts.

- ONNX: ONNX Runtime's graph optimizations run offline (`ORT_ENABLE_EXTENDED`: constant folding, QDQ pairs
  folded into QLinear/integer kernels, GELU/LayerNorm/attention-style fusions where the pattern matches) and
  the optimized graph is saved, so the phone does not redo them at every session start. The phone graph has
  static shapes (the package's fixed length), which is what lets the shape-dependent fusions fire. (Server
  graphs, with dynamic axes, take ONNX Runtime's transformer optimizer instead: converters/optimize_onnx.py.)
- ExecuTorch: fusion happens inside XNNPACK when the program is lowered; what is recorded is the share of
  compute ops that run in the delegate (export_executorch.delegated_share).

`fuse_onnx(src, dst, check_inputs)` writes the optimized model and reports node counts before and after and
the argmax agreement of every output between fused and unfused graphs on the check inputs.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np

from edgekit.io import atomic_path
from edgekit.record import PassRecord


def fuse_onnx(src: str | Path, dst: str | Path, check_inputs: list[list[np.ndarray]]) -> PassRecord:
    """Optimize `src` with ONNX Runtime offline into `dst`; compare both on `check_inputs`."""
    import onnx
    import onnxruntime as ort

    from edgekit.runtime.backends import OnnxBackend

    t0 = time.perf_counter()
    before = onnx.load(str(src))
    with atomic_path(dst) as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp)
        so.log_severity_level = 3
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    after = onnx.load(str(dst))
    a, b = OnnxBackend(src), OnnxBackend(dst)
    same, total = 0, 0
    for x in check_inputs:
        ya, yb = a.run(*x), b.run(*x)
        # decoded graphs answer ids (compared as they are); raw graphs logits (compared by argmax)
        ok = all(np.array_equal(p.argmax(-1), q.argmax(-1)) if p.dtype.kind == "f" and p.ndim > 1
                 else np.array_equal(p, q) if p.dtype.kind != "f" else True for p, q in zip(ya, yb))
        same, total = same + ok, total + 1
    ops = Counter(n.op_type for n in after.graph.node)
    return PassRecord("fuse_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                      seconds=time.perf_counter() - t0,
                      extra={"nodes_before": len(before.graph.node), "nodes_after": len(after.graph.node),
                             "ops_after": dict(ops.most_common()), "agreement": same / max(1, total),
                             "checked": total})
