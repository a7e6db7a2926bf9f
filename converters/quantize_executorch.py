"""Pass: static INT8 quantization for ExecuTorch/XNNPACK (PT2E), with per-layer sensitivity and FP32 fallback.

`quantize_executorch(model, cfg, calib, evaluate)`:
1. word embeddings become weight-only 8- or 4-bit (grouped) tables read by ExecuTorch's quantized embedding
   kernels (`quantized_decomposed::embedding_byte` / `embedding_4bit`); position embeddings are cut to the
   package's fixed length (rows past it are never read);
2. every nn.Linear is quantized static INT8 by PT2E with XNNPACKQuantizer: per-channel symmetric weights,
   per-tensor activations calibrated on real task utterances. Attention products, softmax and LayerNorm stay
   FP32: the -1e4 key mask and the softmax would not survive one INT8 scale;
3. sensitivity: each quantized Linear's output, fed the FP32 model's own input, against the FP32 output (SQNR,
   dB), with its activation and weight scales;
4. mixed precision: while `evaluate` (dev) drops more than the budget against FP32, the least accurate
   Linear goes back to FP32 and the model is quantized again. `keep_fp32` patterns are kept FP32 from the start.

The result is a `QuantizedJoint`: a JointModel-like module (same inputs and outputs) that runs eagerly, with
quantize/dequantize simulated, and lowers to XNNPACK's INT8 kernels when exported.
"""

from __future__ import annotations

import copy
import fnmatch
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from edgekit.converters.onnx_weights import OnnxWeights
from edgekit.record import PassRecord

METHODS = ("minmax", "percentile", "entropy")


@dataclass
class QuantizeConfig:
    """calib_samples: task utterances the activation ranges are calibrated on. embedding_bits: 8, 4 (grouped by
    embedding_group values per scale) or 0 (FP32). keep_fp32: fnmatch patterns over Linear names
    (e.g. "layers.0.*"). weight4: patterns of Linears whose weights are 4-bit per channel, with INT8
    activations quantized per call (XNNPACK qd8-f32-qc4w), where the size budget needs it; the fallback first
    moves such a layer to static INT8. intent_drop_pts / slot_f1_drop_pts: what INT8 may lose against FP32 on
    dev before layers fall back. method / percentile: ONNX Runtime's calibration (quantize_onnx). onnx_weight_only:
    ONNX Runtime's MatMuls get 8-bit weights in blocks of embedding_group with FP32 activations (MatMulNBits)
    instead of static INT8 activations, for runtimes whose integer kernels round differently (the web profile)."""

    calib_samples: int = 512
    embedding_bits: int = 4
    embedding_group: int = 32
    keep_fp32: list[str] = field(default_factory=list)
    weight4: list[str] = field(default_factory=list)  # Linears with 4-bit per-channel weights (dynamic INT8 input)
    intent_drop_pts: float = 0.5
    slot_f1_drop_pts: float = 1.0
    max_fallback: int = 8
    method: str = "minmax"
    percentile: float = 99.9
    onnx_weight_only: bool = False
    # ONNX Runtime's weights (quantize_onnx.OnnxWeights): 4 = MatMulNBits 4-bit for the weight4 Linears. Off by
    # default: on this AVX2 CPU 26-40% slower than static INT8 at the same accuracy (docs/passes.md, export)
    onnx_linear_bits: int = 8
    onnx_block: int = 32
    onnx_accuracy_level: int = 4
    onnx_embedding_scales: str = "fp32"

    def __post_init__(self):
        if self.calib_samples < 1:
            raise ValueError(f"calib_samples must be >= 1, got {self.calib_samples}")
        if self.embedding_bits not in (0, 4, 8):
            raise ValueError(f"embedding_bits must be 0, 4 or 8, got {self.embedding_bits}")
        if self.embedding_group < 2 or self.embedding_group % 2:
            raise ValueError(f"embedding_group must be an even number >= 2, got {self.embedding_group}")
        if self.method not in METHODS:
            raise ValueError(f"calibration method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not 50 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.intent_drop_pts < 0 or self.slot_f1_drop_pts < 0 or self.max_fallback < 0:
            raise ValueError("drop budgets and max_fallback must be >= 0")
        try:
            self.onnx_weights()
        except ValueError as e:  # OnnxWeights names its field: onnx_ makes it this table's key
            raise ValueError(f"onnx_{e}") from None

    def onnx_weights(self):
        """The ONNX Runtime weight settings as quantize_onnx takes them."""
        return OnnxWeights(self.onnx_linear_bits, self.onnx_block, self.onnx_accuracy_level, self.onnx_embedding_scales)


class QuantizedEmbedding(nn.Module):
    """Weight-only quantized embedding table. 8 bits: one symmetric scale per row. 4 bits: one per `group`
    values, two values per byte (the layout ExecuTorch's embedding_4bit kernel reads). Scales are FP16 (the
    kernels' `.dtype` variants read them and answer FP32): on an 8k x 384 table, FP32 group scales would be
    a fifth of the 4-bit table's bytes."""

    def __init__(self, weight: torch.Tensor, bits: int, group: int):
        super().__init__()
        import executorch.kernels.quantized  # noqa: F401  (registers the quantized_decomposed embedding ops)

        V, H = weight.shape
        self.bits, self.dim = bits, H
        w = weight.detach().float()
        if bits == 8:
            scale = (w.abs().amax(1) / 127).clamp(min=1e-4).half()  # (V,)
            self.register_buffer("q", torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8))
        else:
            g = group if H % group == 0 else H
            wg = w.reshape(V, H // g, g)
            scale = (wg.abs().amax(-1) / 7).clamp(min=1e-4).half()  # (V, H / g); the values use the FP16 scale
            q = (torch.round(wg / scale.float()[..., None]).clamp(-8, 7).to(torch.int16) + 8).reshape(V, H)
            self.register_buffer("q", (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8))  # (V, H / 2)
        self.register_buffer("scale", scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.quantized_decomposed
        if self.bits == 8:
            return ops.embedding_byte.dtype(self.q, self.scale, None, -127, 127, ids, dtype=torch.float32)
        return ops.embedding_4bit.dtype(self.q, self.scale, None, -8, 7, ids, dtype=torch.float32)

    def dequantized(self) -> torch.Tensor:
        return self.forward(torch.arange(self.q.shape[0])[None])[0]  # (V, H)


class XnnpackLayerNorm(nn.Module):
    """LayerNorm over the last dim written as ops XNNPACK delegates (its mean is 4-D over the two innermost
    dims), so the encoder lowers as one delegate instead of breaking at every portable native_layer_norm."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        self.weight, self.bias, self.eps = ln.weight, ln.bias, ln.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x4 = x.unsqueeze(-1)  # (B, T, H, 1)
        c = x4 - x4.mean(dim=(-2, -1), keepdim=True)
        var = (c * c).mean(dim=(-2, -1), keepdim=True)  # (B, T, 1, 1)
        # a view back, not squeeze(-1): XNNPACK takes no squeeze, and each one split a layer's delegate in two
        return (c * torch.rsqrt(var + self.eps)).view(x.shape) * self.weight + self.bias


class XnnpackAttention(nn.Module):
    """modeling.model.Attention (same Linears, same arithmetic) with both products as 3-D bmm over B * heads.
    A 4-D matmul lowers to expand + bmm, and XNNPACK takes no expand: every layer broke into five delegates, five
    calls a layer, and five XNNPACK graphs in each length bucket's method."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.query, self.key, self.value, self.out = attn.query, attn.key, attn.value, attn.out
        self.heads, self.head_dim = attn.heads, attn.head_dim

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        nh, hd = self.heads, self.head_dim

        def split(t):  # (B, T, nh*hd) -> (B*nh, T, hd)
            return t.view(B, T, nh, hd).permute(0, 2, 1, 3).reshape(B * nh, T, hd)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.bmm(q, k.transpose(1, 2)).view(B, nh, T, T) * (1.0 / math.sqrt(hd)) + bias  # (B, nh, T, T)
        y = torch.bmm(att.softmax(-1).view(B * nh, T, T), v)  # (B*nh, T, hd)
        return self.out(y.view(B, nh, T, hd).permute(0, 2, 1, 3).reshape(B, T, nh * hd))  # (B, T, H)


class QuantizedJoint(nn.Module):
    """The converted PT2E graph behind a JointModel's interface (forward(input_ids, attention_mask), .cfg)."""

    def __init__(self, graph: nn.Module, cfg, fp32_layers: list[str], weight4_layers: list[str] = ()):
        super().__init__()
        # Not named "graph": re-exporting turns this module into a GraphModule, whose .graph is the fx graph.
        self.net, self.cfg, self.fp32_layers, self.weight4_layers = graph, cfg, list(fp32_layers), list(weight4_layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return self.net(input_ids, attention_mask)


def linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `test` against `ref`, in dB (higher is better)."""
    noise = (ref - test).float().pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * math.log10(max(ref.float().pow(2).sum().item(), 1e-30) / noise)


def _prepare_float(model: nn.Module, cfg: QuantizeConfig, max_len: int) -> nn.Module:
    """A copy with quantized word embeddings, position embeddings cut to max_len rows, and LayerNorm and attention
    written as ops XNNPACK takes (one delegate an encoder, not five a layer)."""
    from edgekit.modeling.model import Attention

    m = copy.deepcopy(model).eval()
    if m.pos_emb.weight.shape[0] > max_len:
        pos = nn.Embedding(max_len, m.pos_emb.weight.shape[1])
        pos.weight.data.copy_(m.pos_emb.weight.data[:max_len])
        m.pos_emb = pos
    if cfg.embedding_bits:
        m.word_emb = QuantizedEmbedding(m.word_emb.weight, cfg.embedding_bits, cfg.embedding_group)
    for name, mod in list(m.named_modules()):
        for child, sub in list(mod.named_children()):
            if isinstance(sub, nn.LayerNorm):
                setattr(mod, child, XnnpackLayerNorm(sub))
            elif isinstance(sub, Attention):
                setattr(mod, child, XnnpackAttention(sub))
    return m


def _convert(m: nn.Module, fp32: set[str], w4: set[str], calib: list[tuple[torch.Tensor, torch.Tensor]]) -> nn.Module:
    """PT2E: export (dynamic batch and length), annotate the Linears not in `fp32` (4-bit weights and dynamic
    INT8 input for `w4`), calibrate, convert."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_module_name_filter,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    qcfg = get_symmetric_quantization_config(is_per_channel=True)
    # 4-bit weights with input quantized per call: XNNPACK's qd8-f32-qc4w kernels. (Static INT8 input with
    # 4-bit weights lowered too, but the .pte disagreed with eager on 18% of slot tags.)
    q4 = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True, weight_qmin=-8, weight_qmax=7)
    # One module-type config (and one per 4-bit layer) rather than one per layer: the quantizer matches every
    # pattern once per config, by tracing it (about 7 torch.export calls each).
    quantizer = XNNPACKQuantizer().set_module_type(nn.Linear, qcfg)
    for name in sorted(w4 - fp32):
        quantizer.set_module_name(name, q4)
    skip = [get_module_name_filter(name) for name in sorted(fp32)]
    quantizer.set_filter_function(lambda node: not any(f(node) for f in skip))
    batch, length = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("length", min=3, max=calib[0][0].shape[1])
    example = (calib[0][0][:2].expand(2, -1).contiguous(), calib[0][1][:2].expand(2, -1).contiguous())
    with torch.no_grad():
        ep = torch.export.export(m, example, dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}),
                                 strict=False)
        prepared = prepare_pt2e(ep.module(), quantizer)
        for ids, mask in calib:
            prepared(ids, mask)
        return allow_exported_model_train_eval(convert_pt2e(prepared))  # .eval() from callers is a no-op


def _fake_quant(x: torch.Tensor, node_args) -> torch.Tensor:
    """Apply a quantize_per_tensor/dequantize_per_tensor node's (scale, zero_point, qmin, qmax) to x. A dynamic
    node (its scale computed per call by choose_qparams) gets the asymmetric range of x itself."""
    scale, zp, qmin, qmax = node_args[1:5]
    if not isinstance(scale, float):  # an fx Node: quantized per call
        lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
        scale = max((hi - lo) / (qmax - qmin), 1e-12)
        zp = int(min(max(round(qmin - lo / scale), qmin), qmax))
    return (torch.clamp(torch.round(x / scale) + zp, qmin, qmax) - zp) * scale


def _module_name(node) -> str | None:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else None


def sensitivity(model: nn.Module, graph: nn.Module, calib: list[tuple[torch.Tensor, torch.Tensor]]) -> list[dict]:
    """Per quantized Linear of `graph` (converted PT2E): scales, and the SQNR of its INT8 output against FP32 when
    both see the FP32 model's input for that layer (isolated: earlier layers' error does not accumulate)."""
    inputs: dict[str, list[torch.Tensor]] = {}
    hooks = [mod.register_forward_hook(lambda mod, a, out, n=n: inputs.setdefault(n, []).append(a[0].detach()))
             for n, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    with torch.no_grad():
        for ids, mask in calib:
            model(ids, mask)
    for h in hooks:
        h.remove()
    rows = []
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.target != torch.ops.aten.linear.default:
            continue
        name = _module_name(node)
        x_dq, w_dq = node.args[0], node.args[1]
        if name not in inputs or "dequantize" not in str(getattr(w_dq, "target", "")):
            continue  # an FP32 (fallback) Linear
        w_q, w_scale, w_zp = (getattr(graph, a.target) for a in w_dq.args[:3])
        weight = (w_q.float() - w_zp[:, None].float()) * w_scale[:, None].float()  # (out, in)
        mod = model.get_submodule(name)
        out_q = next((u for u in node.users if "quantize_per_tensor" in str(u.target)), None)
        static = "dequantize" in str(x_dq.target) and isinstance(x_dq.args[1], float)
        ref_list, test_list = [], []
        for x in inputs[name]:
            ref = F.linear(x, mod.weight, mod.bias)
            y = F.linear(_fake_quant(x, x_dq.args) if "dequantize" in str(x_dq.target) else x, weight, mod.bias)
            ref_list.append(ref)
            test_list.append(_fake_quant(y, out_q.args) if out_q is not None else y)
        sqnr = sqnr_db(torch.cat([r.flatten() for r in ref_list]), torch.cat([t.flatten() for t in test_list]))
        rows.append({"layer": name, "weight_bits": 4 if w_dq.args[5] == 7 else 8, "sqnr_db": round(sqnr, 2),
                     "activations": "static" if static else "dynamic",
                     "act_scale": float(x_dq.args[1]) if static else None,  # None: FP32 or per-call (dynamic)
                     "act_zero_point": int(x_dq.args[2]) if static else None,
                     "out_scale": float(out_q.args[1]) if out_q is not None and isinstance(out_q.args[1], float) else None,
                     "weight_scale_min": float(w_scale.min()), "weight_scale_max": float(w_scale.max()),
                     "weight_scale_mean": float(w_scale.float().mean())})
    return sorted(rows, key=lambda r: r["sqnr_db"])


def quantize_executorch(model: nn.Module, cfg: QuantizeConfig, calib: list[tuple[torch.Tensor, torch.Tensor]],
                        evaluate: Callable[[nn.Module], dict] | None = None,
                        log: Callable[[str], None] = lambda s: None) -> tuple[QuantizedJoint, PassRecord]:
    """Quantize `model` (a JointModel) for XNNPACK. calib: (input_ids, attention_mask) batches at the package's
    fixed length. evaluate(model) -> {"intent_acc", "slot_f1"} on dev drives the FP32 fallback."""
    t0 = time.perf_counter()
    max_len = calib[0][0].shape[1]
    base = _prepare_float(model, cfg, max_len)
    names = linear_names(base)
    fp32 = {n for n in names if any(fnmatch.fnmatch(n, p) for p in cfg.keep_fp32)}
    w4 = {n for n in names if any(fnmatch.fnmatch(n, p) for p in cfg.weight4)} - fp32
    reasons = {n: "--keep-fp32" for n in sorted(fp32)}
    promoted = {}  # 4-bit layers moved to 8 bits, and why
    ref = evaluate(model) if evaluate else None
    tries, fallbacks = [], 0
    while True:
        graph = _convert(base, fp32, w4, calib)
        q = QuantizedJoint(graph, model.cfg, sorted(fp32), sorted(w4))
        got = evaluate(q) if evaluate else None
        drop = {k: round((ref[k] - got[k]) * 100, 2) for k in ("intent_acc", "slot_f1") if ref and got.get(k) is not None
                and ref.get(k) is not None}
        tries.append({"fp32_layers": sorted(fp32), "weight4_layers": sorted(w4), "dev": got, "drop_pts": drop})
        log(f"INT8 with {len(fp32)} FP32 layers: dev drop {drop}")
        over = drop.get("intent_acc", 0) > cfg.intent_drop_pts or drop.get("slot_f1", 0) > cfg.slot_f1_drop_pts
        sens = sensitivity(base, graph, calib[:8])
        if not over or fallbacks >= cfg.max_fallback or not sens:
            break
        worst, fallbacks = sens[0], fallbacks + 1
        why = (f"dev drop {drop} over the budget (intent {cfg.intent_drop_pts}, slot F1 {cfg.slot_f1_drop_pts} "
               f"pts); least accurate layer, SQNR {worst['sqnr_db']} dB")
        if worst["layer"] in w4:  # one step up the ladder: 4-bit weights -> 8-bit -> FP32
            w4.discard(worst["layer"])
            promoted[worst["layer"]] = why
        else:
            fp32.add(worst["layer"])
            reasons[worst["layer"]] = why
    emb = {}
    if cfg.embedding_bits:
        emb = {"bits": cfg.embedding_bits, "group": cfg.embedding_group if cfg.embedding_bits == 4 else None,
               "sqnr_db": round(sqnr_db(model.word_emb.weight.detach(), base.word_emb.dequantized()), 2)}
    rec = PassRecord("quantize", params_before=sum(p.numel() for p in model.parameters()),
                     bytes_before=sum(p.numel() * p.element_size() for p in model.parameters()),
                     bytes_after=_int8_bytes(base, fp32, w4), seconds=time.perf_counter() - t0,
                     extra={"quant_layers": sens, "fp32_layers": [{"layer": n, "why": reasons[n]} for n in sorted(fp32)],
                            "weight4_layers": sorted(w4),
                            "promoted_to_8bit": [{"layer": n, "why": w} for n, w in promoted.items()],
                            "tries": tries, "embedding": emb, "linears": len(names),
                            "quantized_linears": len(names) - len(fp32), "calib_samples": int(sum(len(c[0]) for c in calib)),
                            "fp32_dev": ref})
    if over:
        rec.warnings.append(f"INT8 still drops {drop} on dev after {len(fp32)} layers back in FP32")
    return q, rec


def _int8_bytes(m: nn.Module, fp32: set[str], w4: set[str]) -> int:
    """Weight bytes as stored: INT8 Linears (1 byte a weight, FP32 bias and per-channel scale), FP32 fallbacks,
    the quantized embedding buffers and every other parameter in FP32."""
    total = 0
    for n, mod in m.named_modules():
        if isinstance(mod, nn.Linear):
            per = 4 if n in fp32 else 0.5 if n in w4 else 1
            w = int(mod.weight.numel() * per) + (mod.weight.shape[0] * 4 if n not in fp32 else 0)
            total += w + (mod.bias.numel() * 4 if mod.bias is not None else 0)
        elif isinstance(mod, QuantizedEmbedding):
            total += mod.q.numel() * mod.q.element_size() + mod.scale.numel() * mod.scale.element_size()
        else:
            total += sum(p.numel() * 4 for p in mod.parameters(recurse=False))
    return total


def calibration_batches(inputs: list[list[np.ndarray]], batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stack single-utterance (input_ids, attention_mask) arrays into calibration batches."""
    out = []
    for s in range(0, len(inputs), batch):
        chunk = inputs[s:s + batch]
        out.append((torch.from_numpy(np.concatenate([c[0] for c in chunk])),
                    torch.from_numpy(np.concatenate([c[1] for c in chunk]))))
    return out
