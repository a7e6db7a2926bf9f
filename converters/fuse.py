"""Pass: fixed-shape op fusion, applied to the exported artifacts.

- ONNX: ONNX Runtime's graph optimizations run offline (`ORT_ENABLE_EXTENDED`: constant folding, QDQ pairs
  folded into QLinear/integer kernels, GELU/LayerNorm/attention-style fusions where the pattern matches) and
  the optimized graph is saved, so the phone does not redo them at every session start. The phone graph has
  static shapes (the package's fixed length), which is what lets the shape-dependent fusions fire. (Server
  graphs, with dynamic axes, take ONNX Runtime's transformer optimizer instead: converters/optimize_onnx.py.)
- ExecuTorch: fusion happens inside XNNPACK when the program is lowered; what is recorded is the share of
  compute ops that run in the delegate (export_executorch.delegated_share).

`fuse_onnx(src, dst, check_inputs, cfg)` writes the optimized model and reports node counts before and after and
the argmax agreement of every output between fused and unfused graphs on the check inputs.
`FuseConfig` holds the fusions a profile decides whichever optimizer its fuse stage runs (this one, or the
transformer optimizer of the server graphs).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.io import atomic_path
from edgekit.record import PassRecord


@dataclass
class FuseConfig:
    """ONNX graph fusions of the fuse stage, whichever optimizer it runs."""

    # The residual Add + LayerNormalization fused into SkipLayerNormalization. Off, the manifest's
    # `onnx_disabled_optimizers` keeps ONNX Runtime from fusing them back at load: ONNX Runtime 1.32's CPU kernel
    # of it is slow (a server graph: 0.60 ms against 0.08 ms for the two ops; the SNIPS android graph: p50 0.91-0.92
    # against 1.24-1.30 ms a call, one thread; docs/experiments.md, 2026-12-04). On for a fused GPU kernel.
    skip_layer_norm: bool = False

    @property
    def disabled_optimizers(self) -> list[str]:
        """ONNX Runtime graph optimizers a session of this graph must not run (they would undo a choice above)."""
        return [] if self.skip_layer_norm else ["SkipLayerNormFusion"]


def fuse_onnx(src: str | Path, dst: str | Path, check_inputs: list[list[np.ndarray]],
              cfg: FuseConfig | None = None) -> PassRecord:
    """Optimize `src` with ONNX Runtime offline into `dst`; compare both on `check_inputs`."""
    import onnx
    import onnxruntime as ort

    from edgekit.runtime.backends import OnnxBackend

    cfg = cfg or FuseConfig()
    t0 = time.perf_counter()
    before = onnx.load(str(src))
    with atomic_path(dst) as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp)
        so.log_severity_level = 3
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"],
                             disabled_optimizers=cfg.disabled_optimizers)
    after = onnx.load(str(dst))
    a, b = OnnxBackend(src), OnnxBackend(dst, disabled_optimizers=cfg.disabled_optimizers)
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
