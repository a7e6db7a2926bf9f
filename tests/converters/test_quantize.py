import numpy as np
import pytest
import torch

from edgekit.converters.quantize_executorch import (
    QuantizeConfig,
    QuantizedEmbedding,
    QuantizedJoint,
    linear_names,
    quantize_executorch,
)
from edgekit.modeling.model import JointModel, ModelConfig

T = 12


def tiny(seed=0):
    torch.manual_seed(seed)
    return JointModel(ModelConfig(vocab_size=80, hidden=32, heads=[2, 4], ffn=[64, 48], head_dim=8, n_intents=3,
                                  n_slots=5, max_positions=64)).eval()


def calib(n=4, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 80, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[:, -3:] = 0
        out.append((ids, mask))
    return out


def test_quantize_tiny_model_shapes_record_and_accuracy_of_simulation():
    m = tiny()
    q, rec = quantize_executorch(m, QuantizeConfig(embedding_bits=8), calib())
    ids, mask = calib(1, 2, seed=1)[0]
    ref, got = m(ids, mask), q(ids, mask)
    assert [r.shape for r in ref] == [g.shape for g in got]
    assert all(torch.isfinite(g).all() for g in got)
    assert (ref[0].argmax(-1) == got[0].argmax(-1)).float().mean() >= 0.5
    layers = rec.extra["quant_layers"]
    assert {r["layer"] for r in layers} == set(linear_names(m))  # every Linear quantized and reported
    assert all(r["sqnr_db"] > 10 and r["act_scale"] > 0 for r in layers)  # INT8 of a random net: ~20-40 dB
    assert rec.bytes_after < rec.bytes_before / 2
    assert rec.extra["embedding"]["bits"] == 8 and rec.extra["embedding"]["sqnr_db"] > 30


@pytest.mark.parametrize("bits,group", [(8, 32), (4, 8)])
def test_quantized_embedding_matches_table(bits, group):
    w = torch.randn(50, 16)
    e = QuantizedEmbedding(w, bits, group)
    ids = torch.tensor([[0, 7, 49]])
    err = (e(ids) - w[ids]).abs().max() / w.abs().max()
    assert err < (0.01 if bits == 8 else 0.15)
    assert e.q.numel() * e.q.element_size() == w.numel() * bits // 8  # packed: 4 bits are half a byte


def test_fallback_puts_least_accurate_layers_back_to_fp32_until_the_budget_holds():
    m = tiny()

    def evaluate(model):  # a stand-in dev metric: each FP32 layer wins back 0.3 pt of intent accuracy
        if isinstance(model, QuantizedJoint):
            return {"intent_acc": 0.99 + 0.003 * len(model.fp32_layers), "slot_f1": 0.9}
        return {"intent_acc": 1.0, "slot_f1": 0.9}

    q, rec = quantize_executorch(m, QuantizeConfig(embedding_bits=0, intent_drop_pts=0.5), calib(), evaluate)
    fell = [f["layer"] for f in rec.extra["fp32_layers"]]
    assert len(fell) == 2 and q.fp32_layers == sorted(fell)  # 1.0 -> 0.7 -> 0.4 pt: two layers back
    assert all("SQNR" in f["why"] for f in rec.extra["fp32_layers"])
    first = rec.extra["tries"][0]
    assert first["drop_pts"]["intent_acc"] == pytest.approx(1.0) and len(rec.extra["tries"]) == 3
    _, all_int8 = quantize_executorch(m, QuantizeConfig(embedding_bits=0), calib())
    assert fell[0] == all_int8.extra["quant_layers"][0]["layer"]  # the least accurate layer went back first
    assert fell[0] not in {r["layer"] for r in rec.extra["quant_layers"]}  # now FP32: no longer quantized
    assert rec.extra["quantized_linears"] == len(linear_names(m)) - 2
    assert not rec.warnings


def test_keep_fp32_pattern():
    m = tiny()
    q, rec = quantize_executorch(m, QuantizeConfig(embedding_bits=0, keep_fp32=["layers.0.*"]), calib())
    kept = {f["layer"] for f in rec.extra["fp32_layers"]}
    assert kept == {n for n in linear_names(m) if n.startswith("layers.0.")}
    assert all(f["why"] == "--keep-fp32" for f in rec.extra["fp32_layers"])
    assert not kept & {r["layer"] for r in rec.extra["quant_layers"]}


def test_config_validates():
    for bad in ({"embedding_bits": 3}, {"method": "kl"}, {"percentile": 10}, {"calib_samples": 0}):
        with pytest.raises(ValueError):
            QuantizeConfig(**bad)


CHECKS = [[ids[:1].numpy(), mask[:1].numpy()] for ids, mask in calib(3, 1, seed=2)]
INT8 = QuantizeConfig(embedding_bits=4, embedding_group=8)


def pooled():
    """The tiny model with word pooling (the slot head reads each word's mean piece), as android builds it."""
    from edgekit.modeling.model import enable_word_pool

    m = tiny()
    enable_word_pool(m, [i % 4 == 0 for i in range(80)])
    return m


@pytest.fixture(scope="module")
def int8_pte(tmp_path_factory):
    """The tiny word-pooled model in INT8 (4-bit embeddings) lowered to XNNPACK once: a lowering is most of these
    tests' time."""
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch

    q, _ = quantize_executorch(pooled(), INT8, calib())
    return export_executorch(q, ExecuTorchExportConfig(T), tmp_path_factory.mktemp("int8") / "m.pte", CHECKS)


def test_int8_exports_to_executorch_in_xnnpack_and_to_onnx_runtime(tmp_path, int8_pte):
    """Also: the word pooling's matmuls multiply activations (no weight), so INT8 leaves them FP32 in both
    runtimes (quantized_matmuls counts the Linears alone) and the pooled graph stays delegated."""
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
    from edgekit.converters.fuse import fuse_onnx
    from edgekit.converters.quantize_onnx import quantize_onnx
    from edgekit.runtime.backends import OnnxBackend

    m, rec, checks = pooled(), int8_pte, CHECKS
    assert rec.extra["parity"]["intent_argmax_agree"] >= 2 / 3
    assert "aten.linear.default" not in rec.extra["undelegated_ops"]  # every INT8 Linear runs in XNNPACK
    assert "aten.native_layer_norm.default" not in rec.extra["undelegated_ops"]  # XnnpackLayerNorm
    assert rec.extra["delegated_share"] >= 0.95, rec.extra

    export_onnx(m, OnnxExportConfig(T), tmp_path / "m.onnx", checks)
    cal = [[ids[k:k + 1].numpy(), mask[k:k + 1].numpy()] for ids, mask in calib() for k in range(len(ids))]
    orec = quantize_onnx(tmp_path / "m.onnx", tmp_path / "q.onnx", QuantizeConfig(method="minmax"), cal)
    assert orec.extra["quantized_matmuls"] == len(linear_names(m))
    assert orec.extra["nodes_after"] > orec.extra["nodes_before"]  # QuantizeLinear/DequantizeLinear pairs
    import onnx

    ops = {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    assert "GatherBlockQuantized" in ops and orec.extra["embedding"]["shape"] == [80, 32]  # the word table, 4-bit
    ref, got = OnnxBackend(tmp_path / "m.onnx"), OnnxBackend(tmp_path / "q.onnx")
    for x in checks:
        a, b = ref.run(*x), got.run(*x)
        assert np.isfinite(b[0]).all() and np.abs(a[0] - b[0]).max() < 0.5 * np.abs(a[0]).max() + 0.1

    frec = fuse_onnx(tmp_path / "q.onnx", tmp_path / "f.onnx", cal)
    assert frec.extra["nodes_after"] < frec.extra["nodes_before"]  # QDQ folded into integer kernels
    assert frec.extra["agreement"] == 1.0 and frec.extra["checked"] == len(cal)
    # by default the residual Add + LayerNormalization stay two ops (ONNX Runtime's CPU SkipLayerNormalization is
    # slow); FuseConfig(skip_layer_norm=True) fuses them, with the same answers
    from edgekit.converters.fuse import FuseConfig

    srec = fuse_onnx(tmp_path / "q.onnx", tmp_path / "s.onnx", cal, FuseConfig(skip_layer_norm=True))
    assert "SkipLayerNormalization" not in frec.extra["ops_after"] and frec.extra["ops_after"].get("LayerNormalization")
    assert srec.extra["ops_after"].get("SkipLayerNormalization") and srec.extra["agreement"] == 1.0
    unfused, fused = OnnxBackend(tmp_path / "f.onnx", disabled_optimizers=["SkipLayerNormFusion"]), OnnxBackend(
        tmp_path / "s.onnx")
    for x in checks:
        for a, b in zip(unfused.run(*x), fused.run(*x)):
            np.testing.assert_allclose(a, b, atol=1e-4)


def test_weight4_layers_are_4bit_dynamic_lower_to_xnnpack_and_fall_back_to_int8_first(tmp_path, int8_pte):
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch

    m = pooled()  # the model of int8_pte, so that the two programs' sizes compare
    cfg = QuantizeConfig(embedding_bits=INT8.embedding_bits, embedding_group=INT8.embedding_group,
                         weight4=["*.fc1", "*.fc2"])
    q, rec = quantize_executorch(m, cfg, calib())
    ffn = {n for n in linear_names(m) if n.endswith(("fc1", "fc2"))}
    rows = {r["layer"]: r for r in rec.extra["quant_layers"]}
    assert set(rec.extra["weight4_layers"]) == ffn
    assert all(rows[n]["weight_bits"] == 4 and rows[n]["activations"] == "dynamic" for n in ffn)
    assert all(r["weight_bits"] == 8 and r["activations"] == "static" for n, r in rows.items() if n not in ffn)
    assert all(rows[n]["sqnr_db"] > 5 for n in ffn)  # 4-bit weights: coarser than INT8, still a signal
    got = export_executorch(q, ExecuTorchExportConfig(T), tmp_path / "w4.pte", CHECKS)
    assert "aten.linear.default" not in got.extra["undelegated_ops"]  # qd8-f32-qc4w runs in XNNPACK
    # attention and LayerNorm written as ops XNNPACK takes (bmm, views): no expand or squeeze left between
    # delegates, so a layer is one delegate call, not five
    assert not [op for op in got.extra["undelegated_ops"] if op.startswith(("aten.expand_copy", "aten.squeeze_copy"))]
    assert got.extra["delegate_calls"] <= len(m.layers) + 2, got.extra
    assert got.extra["parity"]["intent_argmax_agree"] == 1.0, got.extra["parity"]  # the .pte computes what eager does
    assert got.bytes_after < int8_pte.bytes_after  # the same model with INT8 FFN weights

    def evaluate(model):  # each 4-bit layer costs 0.3 pt
        if isinstance(model, QuantizedJoint):
            return {"intent_acc": 1.0 - 0.003 * len(model.weight4_layers), "slot_f1": 0.9}
        return {"intent_acc": 1.0, "slot_f1": 0.9}

    q, rec = quantize_executorch(m, QuantizeConfig(embedding_bits=0, weight4=["*.fc1", "*.fc2"],
                                                   intent_drop_pts=0.6), calib(), evaluate)
    promoted = [f["layer"] for f in rec.extra["promoted_to_8bit"]]
    # 1.2 -> 0.9 -> 0.6 pt: two layers up to INT8, none to FP32
    assert len(promoted) == 2 and set(promoted) <= ffn and not rec.extra["fp32_layers"]
    assert set(q.weight4_layers) == ffn - set(promoted)


def test_onnx_int8_of_a_decoded_graph_keeps_its_integer_tables(tmp_path):
    """Only float embedding tables become GatherBlockQuantized: the decoding graph's integer tag tables stay exact."""
    import onnx

    from edgekit.converters.decoding import DecodingConfig, with_decoding, word_positions
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
    from edgekit.converters.quantize_onnx import quantize_onnx
    from edgekit.runtime.backends import OnnxBackend

    tags = ["O", "B-a", "I-a", "B-b", "I-b"]
    dm, _ = with_decoding(tiny(), DecodingConfig(["x", "y", "z"], tags, {"x": {"a"}, "y": {"a", "b"}, "z": set()}))
    inputs = []
    for ids, mask in calib(2):
        for k in range(len(ids)):
            starts = torch.zeros(1, T, dtype=torch.bool)
            starts[0, 1:T - 3] = True
            inputs.append([ids[k:k + 1].numpy(), mask[k:k + 1].numpy(), word_positions(starts).numpy(),
                           np.ones(3, bool), np.asarray([False])])
    export_onnx(dm, OnnxExportConfig(T), tmp_path / "d.onnx", inputs[:4])
    rec = quantize_onnx(tmp_path / "d.onnx", tmp_path / "dq.onnx", QuantizeConfig(method="minmax"), inputs)
    graph = onnx.load(str(tmp_path / "dq.onnx")).graph
    ints = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT64}
    assert any(n.op_type == "Gather" and n.input[0] in ints for n in graph.node)  # the tag tables, untouched
    assert rec.extra["embedding"]["shape"] == [80, 32]  # the word table
    fp, q = OnnxBackend(tmp_path / "d.onnx"), OnnxBackend(tmp_path / "dq.onnx")
    for x in inputs:
        intent, _, tags_q, _ = q.run(*x)
        names = [tags[t] for t in tags_q[0, : T - 4]]
        assert all(not t.startswith("I-") or p[2:] == t[2:] for p, t in zip(["O"] + names, names))  # valid BIO
    agree = np.mean([fp.run(*x)[0][0] == q.run(*x)[0][0] for x in inputs])
    assert agree >= 0.5
