"""Pass: static INT8 quantization of an exported ONNX graph with ONNX Runtime (QDQ, per-channel weights).

`quantize_onnx(src, dst, cfg, calib)` runs `onnxruntime.quantization.quantize_static` with a calibration reader
over real task utterances (the graph's own inputs). Only the MatMul/Gemm nodes that multiply by a weight
initializer are quantized (the encoder's and heads' Linear layers): attention products, softmax, LayerNorm
and the decoding graph stay FP32, as on the ExecuTorch path. Calibration: minmax, percentile (default 99.9)
or entropy (QuantizeConfig.method). Activations are uint8 and weights int8 (U8S8): on x86 ONNX Runtime's S8S8 QDQ
path ran slower than FP32 here (ATIS student, 1 thread: FP32 3.60 ms, S8S8 5.97 ms, U8S8 2.30 ms p50).

With `embedding_bits` 4, the word-embedding lookup (the Gather on the largest constant table) becomes ONNX
Runtime's GatherBlockQuantized: 4-bit symmetric blocks of `embedding_group` values along the hidden axis, as on
the ExecuTorch path (SNIPS: 15.2 MB -> 4.8 MB model; answers identical on 98.1% of test utterances). ONNX
Runtime's weight-only Gather quantizer has no 8-bit mode, so `embedding_bits` 8 leaves the table FP32.

With `onnx_weight_only` the same MatMuls get 8-bit symmetric weights in blocks of `embedding_group` values and
keep FP32 activations (ONNX Runtime's MatMulNBits, accuracy level 1: FP32 arithmetic), and nothing is calibrated.
onnxruntime-web's WASM integer kernels round static INT8 activations differently from the native ones (SNIPS
android package: 1 intent and 13 slot lists of 700 test answers differed); with FP32 activations both answer
the same (700 of 700), at about the INT8 size (docs/experiments.md, 2026-12-02).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgekit.converters.quantize_executorch import QuantizeConfig
from edgekit.io import atomic_path
from edgekit.record import PassRecord


def weight_matmuls(model) -> list[str]:
    """Names of the MatMul/Gemm nodes whose second input is a weight initializer (the Linear layers)."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits]


def quantize_onnx(src: str | Path, dst: str | Path, cfg: QuantizeConfig, calib: list[list[np.ndarray]],
                  exclude: list[str] | None = None, float_outputs: bool = False) -> PassRecord:
    """Write the INT8 QDQ model of `src` to `dst`. calib: the graph's inputs, one list per utterance, in the
    graph's input order. exclude: MatMul/Gemm node names left FP32. float_outputs: the MatMuls' outputs are not
    quantized again (ONNX Runtime runs them as MatMulIntegerToFloat, no requantization)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    t0 = time.perf_counter()
    model = onnx.load(str(src))
    names = [i.name for i in model.graph.input]
    skip = set(exclude or ())
    nodes = [n for n in weight_matmuls(model) if n not in skip]

    if cfg.onnx_weight_only:  # nothing calibrated
        return _weight_only(model, src, dst, cfg, nodes, exclude, t0)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib[: cfg.calib_samples])

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else dict(zip(names, x))

    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[cfg.method]
    extra = {"CalibPercentile": cfg.percentile} if cfg.method == "percentile" else {}
    if float_outputs:
        extra["OpTypesToExcludeOutputQuantization"] = ["MatMul"]
    warnings, used = [], cfg.method
    with atomic_path(dst) as tmp:
        try:
            _run(quantize_static, src, tmp, Reader(), method, nodes, extra, QuantFormat, QuantType)
        except ValueError as e:
            # numpy's histogram refuses a tensor whose range is too narrow for its float spacing ("Too many bins
            # for data range"); min/max calibration has no histogram.
            warnings.append(f"ONNX Runtime {cfg.method} calibration failed ({e}); used minmax")
            used = "minmax"
            extra.pop("CalibPercentile", None)
            _run(quantize_static, src, tmp, Reader(), CalibrationMethod.MinMax, nodes, extra, QuantFormat, QuantType)
    emb = _quantize_embedding(dst, cfg) if cfg.embedding_bits == 4 else None
    out = onnx.load(str(dst))
    return PassRecord("quantize_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                      seconds=time.perf_counter() - t0, warnings=warnings,
                      extra={"method": used, "percentile": cfg.percentile if used == "percentile" else None,
                             "calib_samples": min(len(calib), cfg.calib_samples), "quantized_matmuls": len(nodes),
                             "excluded": sorted(exclude or ()), "embedding": emb, "nodes_before": len(model.graph.node),
                             "nodes_after": len(out.graph.node)})


def _weight_only(model, src: Path, dst: Path, cfg: QuantizeConfig, nodes: list[str], exclude, t0) -> PassRecord:
    """8-bit block weights with FP32 activations on the weight MatMuls (`nodes`); Gemm stays FP32 (MatMulNBits
    has no Gemm form: the heads' small Gemm)."""
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    before = len(model.graph.node)  # the quantizer rewrites `model` in place
    wanted = set(nodes)
    matmuls = [n.name for n in model.graph.node if n.name in wanted and n.op_type == "MatMul"]
    if matmuls:  # the quantizer takes an empty include list as "every MatMul"
        q = MatMulNBitsQuantizer(model, bits=8, block_size=cfg.embedding_group, is_symmetric=True, accuracy_level=1,
                                 nodes_to_include=matmuls, op_types_to_quantize=("MatMul",),
                                 quant_format=QuantFormat.QOperator)
        _quiet(q.process)
    with atomic_path(dst) as tmp:
        onnx.save(q.model.model if matmuls else model, str(tmp))
    emb = _quantize_embedding(dst, cfg) if cfg.embedding_bits == 4 else None
    out = onnx.load(str(dst))
    return PassRecord("quantize_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                      seconds=time.perf_counter() - t0,
                      extra={"method": "weight_only", "weight_bits": 8, "block": cfg.embedding_group,
                             "quantized_matmuls": sum(n.op_type == "MatMulNBits" for n in out.graph.node),
                             "excluded": sorted(exclude or ()), "embedding": emb, "nodes_before": before,
                             "nodes_after": len(out.graph.node)})


def _quantize_embedding(path: Path, cfg: QuantizeConfig) -> dict | None:
    """Embedding-table Gathers -> GatherBlockQuantized (4-bit, blocks of cfg.embedding_group), in place. Returns
    the largest table's node and shape (the word embeddings) and every quantized node."""
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    gathers = [n for n in model.graph.node if n.op_type == "Gather"]
    # Float 2-D tables only (word and position embeddings): the decoding graph also gathers from integer tables,
    # which must stay exact. The quantizer takes every Gather of its op types, so the rest are excluded by name.
    tables = [(int(np.prod(inits[n.input[0]].dims)), n.name, list(inits[n.input[0]].dims)) for n in gathers
              if n.input[0] in inits and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT
              and len(inits[n.input[0]].dims) == 2]
    if not tables:
        return None
    size, node, dims = max(tables)
    chosen = {t[1] for t in tables}
    q = MatMulNBitsQuantizer(model, bits=4, block_size=cfg.embedding_group, is_symmetric=True,
                             nodes_to_exclude=[n.name for n in gathers if n.name not in chosen],
                             op_types_to_quantize=("Gather",), quant_axes=(("Gather", 1),),
                             quant_format=QuantFormat.QOperator)
    _quiet(q.process)
    with atomic_path(path) as tmp:
        onnx.save(q.model.model, str(tmp))
    return {"node": node, "shape": dims, "bits": 4, "group": cfg.embedding_group, "tables": sorted(chosen)}


def _quiet(fn, *args, **kwargs):
    """Run an ONNX Runtime quantizer without its progress output (stdout and INFO logs)."""
    import contextlib
    import io
    import logging

    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return fn(*args, **kwargs)
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def _run(quantize_static, src, dst, reader, method, nodes, extra, QuantFormat, QuantType):
    # The quantizer prints progress and advice ("consider pre-processing") on stdout and the root logger; the
    # build's terminal shows stage results only.
    _quiet(quantize_static, str(src), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=True,
           activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=method,
           nodes_to_quantize=nodes, op_types_to_quantize=["MatMul", "Gemm"],
           extra_options={"ActivationSymmetric": False, **extra})
