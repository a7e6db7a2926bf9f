"""Export a joint model to a fixed-shape ONNX graph, then check it in ONNX Runtime against eager."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgekit.io import atomic_path
from edgekit.record import PassRecord


@dataclass
class OnnxExportConfig:
    max_len: int
    opset: int = 18

    def __post_init__(self):
        if not 2 < self.max_len <= 512:
            raise ValueError(f"max_len must be in 3..512, got {self.max_len}")
        if self.opset < 17:
            raise ValueError("opset must be >= 17 (LayerNormalization)")


def export_onnx(model: torch.nn.Module, cfg: OnnxExportConfig, path: str | Path,
                check_inputs: list[list[np.ndarray]]) -> PassRecord:
    """Write `path` (.onnx, weights inline) and verify it with ONNX Runtime on `check_inputs` (each the graph's
    input list; the first is also the example that fixes the shapes)."""
    import onnx

    from edgekit.converters.decoding import io_names
    from edgekit.converters.parity import compare
    from edgekit.runtime.backends import OnnxBackend

    t0 = time.perf_counter()
    model = model.eval()
    if hasattr(model, "for_runtime"):  # a decoding graph: the variant ONNX Runtime runs fastest
        model = model.for_runtime("onnx")
    example = tuple(torch.from_numpy(a) for a in check_inputs[0])
    if example[0].shape[-1] != cfg.max_len:
        raise ValueError(f"check inputs have length {example[0].shape[-1]}, the export {cfg.max_len}")
    inputs, outputs = io_names(model)
    with torch.no_grad():
        prog = torch.onnx.export(model, example, dynamo=True, opset_version=cfg.opset, external_data=False,
                                 input_names=inputs, output_names=outputs, verbose=False)
    with atomic_path(path) as tmp:
        onnx.save_model(prog.model_proto, str(tmp))
    backend = OnnxBackend(path)
    parity = compare(model, backend.run, check_inputs)
    rec = PassRecord("export_onnx", bytes_after=Path(path).stat().st_size, seconds=time.perf_counter() - t0,
                     extra={"parity": parity, "max_len": cfg.max_len, "opset": cfg.opset,
                            "nodes": len(prog.model_proto.graph.node)})
    if parity["intent_argmax_agree"] < 0.995:
        rec.warnings.append(f"ONNX Runtime intent agreement with eager is {parity['intent_argmax_agree']:.4f}")
    return rec
