"""Pass: ONNX Runtime's transformer optimizer on a server graph, then its precision (FP16 or INT8).

`optimize_onnx(src, dst, cfg, check_inputs, calib, fuse)`:
1. `fusable`: three rewrites that make torch's dynamo export look like the graphs the optimizer's BERT patterns
   were written for (same answers): the token-type row folded into the position table and the position ids
   computed from input_ids' shape (EmbedLayerNormalization), the attention mask's two-axis Unsqueeze split in
   two, and the attention scale as Div rather than Mul (Attention: the pattern takes the first Mul it finds);
2. `onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`: fused Attention (or MultiHeadAttention,
   its Q, K, V projections left as MatMuls), SkipLayerNormalization (with `FuseConfig.skip_layer_norm`),
   EmbedLayerNormalization, BiasGelu; the fused-node counts and `is_fully_optimized()` are recorded;
3. precision: fp16 with `keep_io_types` (the decoding graph stays FP32: its blocked-move scores sum past FP16's
   range), or INT8 after the optimizer: dynamic (weights INT8, activations quantized per call, the fused Attention
   as QAttention) or static (QDQ MatMuls, calibrated; with MultiHeadAttention its Q, K, V projections too);
4. the answers of the result against the unoptimized FP32 graph on `check_inputs` (the whole test split).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.converters.fuse import FuseConfig
from edgekit.io import atomic_path
from edgekit.record import PassRecord

PRECISIONS = ("fp32", "fp16", "int8")
ATTENTION_OPS = ("Attention", "MultiHeadAttention")


@dataclass
class ServerConfig:
    """The server profiles' ONNX graph: a dynamic batch axis, the transformer optimizer in place of the generic
    offline fusion, then a precision. Phones keep the defaults (batch 1, generic fusion, the quantize stage)."""

    batch: bool = False  # dynamic batch axis on every input and output
    seq: str = "fixed"  # with batch: "dynamic" lets input_ids and attention_mask be cut to a batch's longest utterance
    optimize: bool = False  # onnxruntime.transformers optimizer (model_type "bert") in the fuse stage
    precision: str = "fp32"  # after the optimizer: fp32, fp16 or int8
    int8: str = "static"  # with precision int8: "static" (answers independent of the batch) or "dynamic"
    # static INT8: the MatMuls' outputs quantized again too. Off (FP32 outputs, run as MatMulIntegerToFloat): SNIPS
    # server-cpu 9-11% faster and 94.35 against 93.91 slot F1 (docs/experiments.md, 2026-12-04)
    int8_outputs: bool = False
    min_agreement: float = 0.995  # answers equal to the unoptimized FP32 graph's, share of the test split
    # Dev points (intent accuracy, slot F1) the precision may lose against the unfused FP32 graph; past it the fuse
    # stage ships the optimizer's FP32 graph. The device's own slot F1 budget: all-mpnet-base-v2's INT8 lost 0.72
    # (SNIPS dev; 0.69 on test), enough that the cascade found nothing to escalate to, while MiniLM-L6's lost 0.0
    # (docs/experiments.md, 2026-12-06). A broken graph (all-mpnet-base-v2 once lost 80 points) fails it too.
    max_loss_pts: float = 0.5
    # The fused attention op. "Attention" takes the Q, K and V projections inside (they stay FP32 under static INT8);
    # "MultiHeadAttention" leaves them as MatMuls before it, which static INT8 quantizes.
    attention: str = "Attention"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.int8 not in ("dynamic", "static"):
            raise ValueError(f"int8 must be dynamic or static, got {self.int8!r}")
        if self.seq not in ("fixed", "dynamic"):
            raise ValueError(f"seq must be fixed or dynamic, got {self.seq!r}")
        if self.seq == "dynamic" and not self.batch:
            raise ValueError("seq = dynamic needs batch = true (phone graphs keep one fixed length)")
        if self.precision != "fp32" and not self.optimize:
            raise ValueError("precision needs optimize = true (it is applied to the optimized graph)")
        if not 0 <= self.max_loss_pts < math.inf:
            raise ValueError(f"max_loss_pts must be a finite number of points >= 0, got {self.max_loss_pts}")
        if not 0 <= self.min_agreement <= 1:
            raise ValueError(f"min_agreement must be in [0, 1], got {self.min_agreement}")
        if self.attention not in ATTENTION_OPS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_OPS)}, got {self.attention!r}")
        # settings of the optimizer's graph, meaningless (and silently ignored) without it
        if not self.optimize and self.attention != "Attention":
            raise ValueError("attention needs optimize = true (the transformer optimizer's choice)")
        if self.int8_outputs and (self.precision, self.int8) != ("int8", "static"):
            raise ValueError("int8_outputs needs precision = int8 and int8 = static")

    def expected_fusions(self, skip_layer_norm: bool) -> list[str]:
        """The fused ops the optimizer should find in a BERT graph, with these settings."""
        return [self.attention, *(["SkipLayerNormalization"] if skip_layer_norm else []),
                "EmbedLayerNormalization", "BiasGelu"]


def fusable(model) -> list[str]:
    """Rewrite `model` (onnx.ModelProto, in place) so the optimizer's BERT patterns match; returns what changed."""
    from onnx import helper, numpy_helper

    g, done = model.graph, []
    inits = {i.name: i for i in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    value = lambda name: numpy_helper.to_array(inits[name])  # noqa: E731

    def add_const(name, array):
        g.initializer.append(numpy_helper.from_array(array, name))
        inits[name] = g.initializer[-1]

    # 1. LayerNorm(Add(Add(Gather(word, ids), Gather(pos, arange)), type_row)) -> LayerNorm(Add(...)) with the
    #    type row inside the position table, the positions Expand(Range(Shape(ids)[1])) as BERT's exporter made
    #    (the exporter's own Range, on a dynamic sequence axis, is not the pattern the optimizer looks for).
    ln = next((n for n in g.node if n.op_type == "LayerNormalization"), None)
    add_t = prod.get(ln.input[0]) if ln is not None else None
    row = next((i for i in add_t.input if i in inits), None) if add_t is not None and add_t.op_type == "Add" else None
    inner = prod.get(next((i for i in add_t.input if i != row), "")) if row else None
    parts = list(inner.input) if inner is not None and inner.op_type == "Add" else []
    graph_inputs = {i.name for i in g.input}
    gathers = [prod[i] for i in parts if i in prod and prod[i].op_type == "Gather" and prod[i].input[0] in inits]
    word = next((n for n in gathers if n.input[1] in graph_inputs), None)
    # the position rows: constant ids (a fixed length) or a Range over the sequence length (a dynamic axis)
    pos = next((n for n in gathers if n is not word), None)
    folded = next((i for i in parts if i in inits and value(i).ndim == 2), None)  # the exporter gathered it: (T, H)
    if word is not None and (pos is not None or folded) and value(row).ndim == 1:
        table = pos.input[0] if pos is not None else folded
        inits[table].CopyFrom(numpy_helper.from_array(value(table) + value(row), table))
        ln.input[0] = inner.output[0]
        g.node.remove(add_t)
        for name, v in (("ek_one", np.array(1)), ("ek_zero", np.array(0)), ("ek_axis0", np.array([0]))):
            add_const(name, v.astype(np.int64))
        ids = word.input[1]
        chain = [helper.make_node("Shape", [ids], ["ek_ids_shape"], name="ek_ids_shape"),
                 helper.make_node("Gather", ["ek_ids_shape", "ek_one"], ["ek_seq"], axis=0, name="ek_seq"),
                 helper.make_node("Range", ["ek_zero", "ek_seq", "ek_one"], ["ek_range"], name="ek_range"),
                 helper.make_node("Unsqueeze", ["ek_range", "ek_axis0"], ["ek_range2"], name="ek_range2"),
                 helper.make_node("Expand", ["ek_range2", "ek_ids_shape"], ["ek_position_ids"], name="ek_pos")]
        if pos is None:  # a Gather over the exporter's (T, H) rows, which the position ids select
            chain.append(helper.make_node("Gather", [folded, "ek_position_ids"], ["ek_pos_rows"], name="ek_pos_rows"))
            inner.input[parts.index(folded)] = "ek_pos_rows"
            k = list(g.node).index(inner)
        else:
            pos.input[1] = "ek_position_ids"
            k = list(g.node).index(pos)
        for j, n in enumerate(chain):
            g.node.insert(k + j, n)
        done.append("embedding: token-type row folded into the position table; position ids from the shape")
    # 2. a multi-axis Unsqueeze (the attention mask's (B, T) -> (B, 1, 1, T)) -> one Unsqueeze per axis
    for n in [n for n in g.node if n.op_type == "Unsqueeze" and len(n.input) > 1 and n.input[1] in inits]:
        axes = sorted(value(n.input[1]).reshape(-1).tolist())
        if len(axes) < 2:
            continue
        k, cur = list(g.node).index(n), n.input[0]
        g.node.remove(n)
        for j, a in enumerate(axes):
            name, out = f"{n.name}_axis{j}", n.output[0] if j == len(axes) - 1 else f"{n.name}_out{j}"
            add_const(name, np.array([a], np.int64))
            g.node.insert(k + j, helper.make_node("Unsqueeze", [cur, name], [out], name=f"{n.name}_{j}"))
            cur = out
        done.append(f"unsqueeze {n.name} split")
    # 3. Softmax(Add(Mul(MatMul(q, k), c), mask)) -> Div(MatMul, 1 / c)
    prod = {o: n for n in g.node for o in n.output}
    for sm in [n for n in g.node if n.op_type == "Softmax"]:
        add = prod.get(sm.input[0])
        for mul in [prod.get(i) for i in (add.input if add is not None and add.op_type == "Add" else [])]:
            if (mul is not None and mul.op_type == "Mul" and mul.input[1] in inits and value(mul.input[1]).size == 1
                    and getattr(prod.get(mul.input[0]), "op_type", "") == "MatMul"):
                inv = mul.input[1] + "_inv"
                if inv not in inits:
                    c = value(mul.input[1])
                    add_const(inv, (1.0 / c).astype(c.dtype))
                mul.op_type, mul.input[1] = "Div", inv
                done.append("attention scale as Div")
    del g.value_info[:]  # shapes are inferred again; some changed (the position ids)
    return done


def decoding_nodes(model) -> list[str]:
    """Names of the decoding graph's nodes (those the exporter records outside the wrapped `model` module)."""
    out = []
    for n in model.graph.node:
        meta = {p.key: p.value for p in n.metadata_props}
        top = meta.get("pkg.torch.onnx.class_hierarchy", "")
        scopes = meta.get("pkg.torch.onnx.name_scopes", "")
        if "DecodedModel" in top.split(",")[0] and not scopes.startswith("['', 'model'"):
            out.append(n.name)
    return out


def optimize_onnx(src: str | Path, dst: str | Path, cfg: ServerConfig, check_inputs: list[list[np.ndarray]],
                  calib: list[list[np.ndarray]] | None = None, fuse: FuseConfig | None = None) -> PassRecord:
    """Optimize `src` into `dst` (see the module docstring); check both on `check_inputs`."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from edgekit.converters.quantize_onnx import _quiet

    ort.set_default_logger_severity(3)  # the optimizer's and calibrator's sessions: no initializer chatter
    fuse = fuse or FuseConfig()
    t0 = time.perf_counter()
    model = onnx.load(str(src))
    nodes_before = len(model.graph.node)
    rewrites, keep_fp32 = fusable(model), decoding_nodes(model)
    with atomic_path(Path(dst).with_suffix(".prep.onnx")) as tmp:
        onnx.save(model, str(tmp))
    prep = Path(dst).with_suffix(".prep.onnx")
    options = FusionOptions("bert")
    options.use_multi_head_attention = cfg.attention == "MultiHeadAttention"
    options.enable_skip_layer_norm = fuse.skip_layer_norm
    opt = _quiet(optimize_model, str(prep), model_type="bert", num_heads=0, hidden_size=0, opt_level=0,
                 optimization_options=options)
    _keep_inputs(opt.model, model)
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    fully = bool(_quiet(opt.is_fully_optimized))
    extra = {"rewrites": rewrites, "fused": fused, "fully_optimized": fully, "precision": cfg.precision}
    if cfg.precision == "fp16":
        names = {n.name for n in opt.model.graph.node}
        _quiet(opt.convert_float_to_float16, keep_io_types=True, node_block_list=[n for n in keep_fp32 if n in names])
        extra["fp32_nodes"] = len(keep_fp32)
        extra["duplicate_casts_dropped"] = drop_duplicate_nodes(opt.model)
    with atomic_path(dst) as tmp:
        opt.save_model_to_file(str(tmp))
    prep.unlink()
    if cfg.precision == "int8":
        extra["int8"] = _int8(dst, cfg, calib or [], keep_fp32)
    out = onnx.load(str(dst))
    extra.update(nodes_before=nodes_before, nodes_after=len(out.graph.node),
                 ops_after=dict(Counter(n.op_type for n in out.graph.node).most_common()),
                 cpu_casts_inserted=_inserted_casts(dst) if cfg.precision == "fp16" else 0)
    extra.update(_agreement(src, dst, check_inputs, cfg.batch, cfg.seq == "dynamic", fuse.disabled_optimizers))
    rec = PassRecord("optimize_onnx", bytes_before=Path(src).stat().st_size, bytes_after=Path(dst).stat().st_size,
                     seconds=time.perf_counter() - t0, extra=extra)
    if extra.get("batch_parity", {}).get("agree", 1.0) < 1.0:
        rec.warnings.append(f"answered in batches of 32, {100 * extra['batch_parity']['agree']:.2f}% of test answers "
                            "equal the one-by-one ones (dynamic INT8 quantizes a batch with one scale)")
    if extra.get("trim_parity", {}).get("agree", 1.0) < 1.0:
        rec.warnings.append(f"inputs cut to their own length answer differently: {extra['trim_parity']}")
    missing = [k for k in cfg.expected_fusions(fuse.skip_layer_norm) if not fused.get(k)]
    if missing:
        rec.warnings.append(f"the transformer optimizer fused no {', '.join(missing)}")
    if cfg.precision == "fp16" and extra["agreement"] < cfg.min_agreement:
        rec.warnings.append(f"{cfg.precision} answers agree with FP32 on {100 * extra['agreement']:.2f}% of "
                            f"{extra['checked']} test utterances (< {100 * cfg.min_agreement:.1f}%)")
    return rec


def _keep_inputs(opt, original) -> None:
    """Put back graph inputs the optimizer pruned as unused (word_pos when the data has no slots): every package
    graph takes the manifest's inputs, in its order, so a client feeds all of them whatever the data."""
    have = {i.name: i for i in opt.graph.input}
    inputs = [have.get(i.name, i) for i in original.graph.input]
    del opt.graph.input[:]
    opt.graph.input.extend(inputs)


def _int8(path: Path, cfg: ServerConfig, calib: list[list[np.ndarray]], keep_fp32: list[str]) -> dict:
    """INT8 of the optimized graph, in place. The quantizers need every tensor's type, which ONNX's own
    inference cannot give for the fused com.microsoft ops: ONNX Runtime's symbolic shape inference types them
    first (without it the static quantizer silently skipped every activation). Dynamic: MatMul and the fused
    Attention (-> QAttention), activations quantized per call with one scale per batch. Static: QDQ MatMuls with
    scales calibrated on train utterances (ONNX Runtime has no static QAttention), their outputs FP32 unless
    `int8_outputs`; the intent head (Gemm) stays FP32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from edgekit.converters.quantize_onnx import QuantizeConfig, _quiet, quantize_onnx

    before = Path(path).stat().st_size
    typed = Path(path).with_suffix(".typed.onnx")
    model = SymbolicShapeInference.infer_shapes(onnx.load(str(path)), auto_merge=True)
    with atomic_path(typed) as tmp:
        onnx.save(model, str(tmp))
    heads = [n.name for n in model.graph.node if n.op_type == "Gemm"]
    with atomic_path(path) as tmp:
        if cfg.int8 == "dynamic":
            _quiet(quantize_dynamic, str(typed), str(tmp), weight_type=QuantType.QInt8, per_channel=False,
                   op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=keep_fp32)
        else:
            quantize_onnx(typed, tmp, QuantizeConfig(embedding_bits=8), calib, exclude=keep_fp32 + heads,
                          float_outputs=not cfg.int8_outputs)
    typed.unlink()
    ops = Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    return {"mode": cfg.int8, "bytes_before": before,
            "quantized_ops": {k: v for k, v in ops.items() if k.startswith(("Q", "DynamicQuantize", "MatMulInteger"))
                              or k in ("QuantizeLinear", "DequantizeLinear")}}


def drop_duplicate_nodes(model) -> int:
    """Remove nodes that repeat an earlier node exactly (name, inputs, outputs, attributes), and repeated value_info
    entries; returns how many nodes went. ONNX Runtime's FP16 converter before 1.32 adds one Cast per FP32 consumer
    of an FP16 tensor, all with the same name and output, which no session loads ("two nodes with same node name");
    onnxruntime-gpu, the `gpu` extra, is at 1.31.1. The first copy feeds every consumer."""
    seen, keep = set(), []
    for node in model.graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            keep.append(node)
    dropped = len(model.graph.node) - len(keep)
    if dropped:
        del model.graph.node[:]
        model.graph.node.extend(keep)
        infos, names = [], set()
        for vi in model.graph.value_info:
            if vi.name not in names:
                names.add(vi.name)
                infos.append(vi)
        del model.graph.value_info[:]
        model.graph.value_info.extend(infos)
    return dropped


def _inserted_casts(path: Path) -> int:
    """Cast nodes ONNX Runtime's CPU provider adds to an FP16 graph (float16 nodes without a CPU kernel run in
    FP32 between casts): the count says how much of the FP16 graph the CPU check really ran in FP16."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(Path(d) / "m.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        after = sum(n.op_type == "Cast" for n in onnx.load(str(Path(d) / "m.onnx")).graph.node)
    return after - sum(n.op_type == "Cast" for n in onnx.load(str(path)).graph.node)


def _agreement(src: Path, dst: Path, check_inputs: list[list[np.ndarray]], batch: bool,
               dynamic_seq: bool = False, disabled_optimizers: list[str] | None = None) -> dict:
    """Share of `check_inputs` on which `dst` answers as `src` (`same_answer`, per-piece outputs on the real
    pieces); with `batch`, also `dst` in batches of 32 against itself one by one (dynamic INT8 quantizes a batch's
    activations with one scale, so an answer may depend on its batch); with `dynamic_seq`, also `dst` on inputs
    cut as the runtime cuts them (`trim_parity`)."""
    from edgekit.converters.parity import batch_parity, same_answer, trim_parity
    from edgekit.runtime.backends import OnnxBackend

    a, b = OnnxBackend(src), OnnxBackend(dst, disabled_optimizers=disabled_optimizers)
    singles = [b.run(*x) for x in check_inputs]
    same, diff = 0, 0.0
    for x, got in zip(check_inputs, singles):
        ok, d = same_answer(a.run(*x), got, x[1].astype(bool))  # x[1]: the (B, T) attention mask
        same, diff = same + ok, max(diff, d)
    out = {"agreement": same / max(1, len(check_inputs)), "checked": len(check_inputs), "max_abs_diff": diff}
    if batch:
        out["batch_parity"] = batch_parity(b.run, check_inputs, singles)
    if dynamic_seq:
        out["trim_parity"] = trim_parity(b.run, check_inputs[:200])
    return out
