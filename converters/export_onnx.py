"""Export a joint model to an ONNX graph (fixed sequence length unless `dynamic_seq`), then check it in ONNX
Runtime against eager.

Phones get batch 1. Server profiles (`batch=True`) get a dynamic batch axis on every input and output, and with
`dynamic_seq` a dynamic sequence axis on input_ids and attention_mask: a batch is cut to its longest utterance.
The word axis (word_pos, the tags) stays the package's max_len - 2, because the in-graph Viterbi is unrolled over
it. A batched graph is also checked batched: one call on all the check inputs answers as the calls one by one do,
and a dynamic one also on the check inputs cut to their own lengths."""

from __future__ import annotations

import contextlib
import io
import time
from contextlib import contextmanager
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
    batch: bool = False  # dynamic batch axis (server profiles)
    dynamic_seq: bool = False  # with batch: input_ids and attention_mask of any length 3..max_len

    def __post_init__(self):
        if not 2 < self.max_len <= 512:
            raise ValueError(f"max_len must be in 3..512, got {self.max_len}")
        if self.opset < 17:
            raise ValueError("opset must be >= 17 (LayerNormalization)")
        if self.dynamic_seq and not self.batch:
            raise ValueError("dynamic_seq needs batch (phone graphs keep one fixed length)")


def export_onnx(model: torch.nn.Module, cfg: OnnxExportConfig, path: str | Path,
                check_inputs: list[list[np.ndarray]]) -> PassRecord:
    """Write `path` (.onnx, weights inline) and verify it with ONNX Runtime on `check_inputs` (each the graph's
    input list; the first is also the example that fixes the shapes)."""
    import onnx

    from edgekit.converters.decoding import io_names
    from edgekit.converters.parity import batch_parity, compare, low_agreement, trim_parity
    from edgekit.runtime.backends import OnnxBackend

    t0 = time.perf_counter()
    model = model.eval()
    if hasattr(model, "for_runtime"):  # a decoding graph: the variant ONNX Runtime runs fastest
        model = model.for_runtime("onnx", cfg.batch)
    first = check_inputs[0]
    if first[0].shape[-1] != cfg.max_len:
        raise ValueError(f"check inputs have length {first[0].shape[-1]}, the export {cfg.max_len}")
    dynamic = None
    if cfg.batch:  # an example of batch 2: torch.export would specialise a batch of 1
        first = [np.concatenate([a, b], 0) for a, b in zip(check_inputs[0], check_inputs[-1])]
        batch = torch.export.Dim("batch", min=1, max=4096)
        dynamic = [{0: batch} for _ in first]
        if cfg.dynamic_seq:  # input_ids and attention_mask; 3: [CLS], one piece, [SEP]
            seq = torch.export.Dim("seq", min=3, max=cfg.max_len)
            dynamic[0] = dynamic[1] = {0: batch, 1: seq}
        dynamic = tuple(dynamic)
    example = tuple(torch.from_numpy(a) for a in first)
    inputs, outputs = io_names(model)
    with torch.no_grad(), _quiet_exporter():
        prog = torch.onnx.export(model, example, dynamo=True, opset_version=cfg.opset, external_data=False,
                                 input_names=inputs, output_names=outputs, verbose=False, dynamic_shapes=dynamic)
    with atomic_path(path) as tmp:
        onnx.save_model(prog.model_proto, str(tmp))
    backend = OnnxBackend(path)
    parity = compare(model, backend.run, check_inputs)
    rec = PassRecord("export_onnx", bytes_after=Path(path).stat().st_size, seconds=time.perf_counter() - t0,
                     extra={"parity": parity, "max_len": cfg.max_len, "opset": cfg.opset, "batch": cfg.batch,
                            "dynamic_seq": cfg.dynamic_seq, "nodes": len(prog.model_proto.graph.node)})
    if cfg.dynamic_seq:  # each check input cut to its own length answers as at the full length
        rec.extra["trim_parity"] = trim_parity(backend.run, check_inputs)
        if rec.extra["trim_parity"]["agree"] < 1.0:
            rec.warnings.append(f"inputs cut to their own length answer differently: {rec.extra['trim_parity']}")
    if warning := low_agreement("ONNX Runtime", parity):
        rec.warnings.append(warning)
    if cfg.batch:
        rec.extra["batch_parity"] = batch_parity(backend.run, check_inputs, batch=len(check_inputs))
        if rec.extra["batch_parity"]["agree"] < 1.0:
            rec.warnings.append(f"batched answers differ from one-by-one ones: {rec.extra['batch_parity']}")
    return rec


@contextmanager
def _quiet_exporter():
    """torch.onnx prints its progress lines to stdout; the build's terminal shows stage results only."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield
