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

`OnnxWeights` (the `weights` argument) chooses the weights' precision: `linear_bits` 4 gives the Linears that
`QuantizeConfig.weight4` names (the ExecuTorch path's 4-bit ones, matched on the module names the exporter records)
4-bit symmetric weights in blocks of `block` input values, ONNX Runtime's MatMulNBits, which its CPU provider and
onnxruntime-web's WASM one run; the other Linears stay static INT8 (or 8-bit blocks with `onnx_weight_only`).
`embedding_scales` "fp16" stores the 4-bit tables' scales in FP16, as ExecuTorch's embedding_4bit does. SNIPS
android student (docs/experiments.md, 2026-12-07): static INT8 5.00 MB against 4.06 MB with 4-bit Linears (3.83 MB
with FP16 embedding scales), dev and test within one utterance, but p50 26-40% higher on one AVX2 core without VNNI
(2.74 against 3.45 ms), so 8 bits stay the default; FP16 scales add 5-6%. Weight-only (the web profile): 5.29 MB
against 4.06 MB, 2.8 times faster native (11.8 against 4.2 ms), 5-6% slower in WASM (17.4 against 18.5 ms), answers
identical in WASM and native (700 of 700).
"""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path

import numpy as np

from edgekit.converters.onnx_weights import OnnxWeights  # noqa: F401 (imported from here by callers)
from edgekit.converters.quantize_executorch import QuantizeConfig
from edgekit.io import atomic_path
from edgekit.record import PassRecord


def linear_name(node) -> str | None:
    """The torch module name of an exported Linear's node, relative to the joint model ("layers.0.fc1"), from the
    scopes torch's exporter records beside each node; a decoding graph's joint model is its submodule `model`."""
    import ast

    meta = {p.key: p.value for p in node.metadata_props}
    try:
        scopes = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])  # ['', 'model', ..., 'model.layers.0.fc1', op]
        classes = ast.literal_eval(meta["pkg.torch.onnx.class_hierarchy"])  # the module class of each scope
    except (KeyError, ValueError, SyntaxError):
        return None
    names = [n for n, c in zip(scopes, classes) if c.endswith("nn.modules.linear.Linear")]
    if not names:
        return None
    decoded = bool(classes) and classes[0].endswith("DecodedModel")
    return names[-1].removeprefix("model.") if decoded else names[-1]


def weight4_matmuls(model, nodes: list[str], patterns: list[str]) -> list[str]:
    """Of `nodes`, the MatMuls whose Linear matches one of `patterns` (fnmatch; MatMulNBits has no Gemm form)."""
    wanted = set(nodes)
    return [n.name for n in model.graph.node if n.name in wanted and n.op_type == "MatMul"
            and any(fnmatch.fnmatchcase(linear_name(n) or "", p) for p in patterns)]


def weight_matmuls(model) -> list[str]:
    """Names of the MatMul/Gemm nodes whose second input is a weight initializer (the Linear layers)."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits]


def quantize_onnx(src: str | Path, dst: str | Path, cfg: QuantizeConfig, calib: list[list[np.ndarray]],
                  exclude: list[str] | None = None, float_outputs: bool = False,
                  weights: OnnxWeights | None = None) -> PassRecord:
    """Write the INT8 QDQ model of `src` to `dst`. calib: the graph's inputs, one list per utterance, in the
    graph's input order. exclude: MatMul/Gemm node names left FP32. float_outputs: the MatMuls' outputs are not
    quantized again (ONNX Runtime runs them as MatMulIntegerToFloat, no requantization). weights: OnnxWeights
    (default: every Linear INT8, FP32 embedding scales)."""
    import onnx

    weights = weights or OnnxWeights()
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    skip = set(exclude or ())
    nodes = [n for n in weight_matmuls(model) if n not in skip]
    four = weight4_matmuls(model, nodes, cfg.weight4) if weights.linear_bits == 4 else []
    missed = []
    if weights.linear_bits == 4 and not four:
        missed.append(f"linear_bits 4: no MatMul matches weight4 {cfg.weight4}; every Linear keeps 8 bits")
    if cfg.onnx_weight_only:  # nothing calibrated
        return _weight_only(model, src, dst, cfg, nodes, four, weights, exclude, t0, missed)
    static = [n for n in nodes if n not in set(four)]
    warnings, used = _static(model, src, dst, cfg, calib, static, float_outputs)
    warnings += missed
    if four:  # after the static pass, which leaves these MatMuls FP32 (their input, too, stays FP32)
        _nbits(dst, four, 4, weights.block, weights.accuracy_level)
    emb = _quantize_embedding(dst, cfg, weights.embedding_scales) if cfg.embedding_bits == 4 else None
    out = onnx.load(str(dst))
    return PassRecord("quantize_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                      seconds=time.perf_counter() - t0, warnings=warnings,
                      extra={"method": used, "percentile": cfg.percentile if used == "percentile" else None,
                             "calib_samples": min(len(calib), cfg.calib_samples), "quantized_matmuls": len(nodes),
                             "weight4_matmuls": len(four), "weights": weights.to_dict(),
                             "excluded": sorted(exclude or ()), "embedding": emb, "nodes_before": len(model.graph.node),
                             "nodes_after": len(out.graph.node)})


def _static(model, src: Path, dst: Path, cfg: QuantizeConfig, calib: list[list[np.ndarray]], nodes: list[str],
            float_outputs: bool) -> tuple[list[str], str]:
    """quantize_static on `nodes` of `src` into `dst` (a copy when there are none: the quantizer reads an empty
    list as "every node"). Returns (warnings, the calibration method used)."""
    import shutil

    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    names = [i.name for i in model.graph.input]

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
        if not nodes:
            shutil.copyfile(src, tmp)
            return warnings, used
        try:
            _run(quantize_static, src, tmp, Reader(), method, nodes, extra, QuantFormat, QuantType)
        except ValueError as e:
            # numpy's histogram refuses a tensor whose range is too narrow for its float spacing ("Too many bins
            # for data range"); min/max calibration has no histogram.
            warnings.append(f"ONNX Runtime {cfg.method} calibration failed ({e}); used minmax")
            used = "minmax"
            extra.pop("CalibPercentile", None)
            _run(quantize_static, src, tmp, Reader(), CalibrationMethod.MinMax, nodes, extra, QuantFormat, QuantType)
    return warnings, used


def _nbits(path: Path, matmuls: list[str], bits: int, block: int, accuracy_level: int) -> None:
    """`matmuls` (MatMul nodes with a weight initializer) of the model at `path` -> MatMulNBits: symmetric `bits`-bit
    weights in blocks of `block` input values, one FP32 scale each; in place."""
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if not matmuls:
        return
    model = onnx.load(str(path))
    # The quantizer takes every node of its op types, nodes_to_include or not (ONNX Runtime 1.32): the others are
    # excluded by name.
    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in set(matmuls)]
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=True, accuracy_level=accuracy_level,
                             nodes_to_exclude=others, op_types_to_quantize=("MatMul",),
                             quant_format=QuantFormat.QOperator)
    _quiet(q.process)
    with atomic_path(path) as tmp:
        onnx.save(q.model.model, str(tmp))


def _weight_only(model, src: Path, dst: Path, cfg: QuantizeConfig, nodes: list[str], four: list[str],
                 weights: OnnxWeights, exclude, t0, warnings: list[str]) -> PassRecord:
    """Block weights with FP32 activations and FP32 arithmetic on the weight MatMuls (`nodes`): 4-bit on `four`,
    8-bit on the rest; Gemm stays FP32 (MatMulNBits has no Gemm form: the heads' small Gemm)."""
    import onnx

    before = len(model.graph.node)
    matmuls = [n.name for n in model.graph.node if n.name in set(nodes) - set(four) and n.op_type == "MatMul"]
    with atomic_path(dst) as tmp:
        onnx.save(model, str(tmp))
    _nbits(dst, four, 4, weights.block, 1)
    _nbits(dst, matmuls, 8, cfg.embedding_group, 1)
    emb = _quantize_embedding(dst, cfg, weights.embedding_scales) if cfg.embedding_bits == 4 else None
    out = onnx.load(str(dst))
    return PassRecord("quantize_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                      seconds=time.perf_counter() - t0, warnings=warnings,
                      extra={"method": "weight_only", "weight_bits": 8, "block": cfg.embedding_group,
                             "weight4_block": weights.block if four else None,
                             "quantized_matmuls": sum(n.op_type == "MatMulNBits" for n in out.graph.node),
                             "weight4_matmuls": len(four), "weights": weights.to_dict(),
                             "excluded": sorted(exclude or ()), "embedding": emb, "nodes_before": before,
                             "nodes_after": len(out.graph.node)})


def _quantize_embedding(path: Path, cfg: QuantizeConfig, scales: str = "fp32") -> dict | None:
    """Embedding-table Gathers -> GatherBlockQuantized (4-bit, blocks of cfg.embedding_group), in place, their
    scales in FP32 or FP16 (`scales`). Returns the largest table's node and shape (the word embeddings) and every
    quantized node."""
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
    if scales == "fp16":
        _fp16_scales(q.model.model)
    with atomic_path(path) as tmp:
        onnx.save(q.model.model, str(tmp))
    return {"node": node, "shape": dims, "bits": 4, "group": cfg.embedding_group, "tables": sorted(chosen),
            "scales": scales}


def _fp16_scales(model) -> None:
    """Each GatherBlockQuantized's scales -> FP16, in place. The op answers in its scales' type, so a Cast to FP32
    follows it under its old output name (the rest of the graph is unchanged)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    for k in [k for k, n in enumerate(model.graph.node) if n.op_type == "GatherBlockQuantized"][::-1]:
        node = model.graph.node[k]
        scale = inits[node.input[2]]
        scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale).astype(np.float16), scale.name))
        out, half = node.output[0], node.output[0] + "_fp16"
        node.output[0] = half
        model.graph.node.insert(k + 1, helper.make_node("Cast", [half], [out], to=TensorProto.FLOAT,
                                                        name=node.name + "_to_fp32"))


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
