"""ONNX Runtime's 4-bit weights (quantize_onnx's OnnxWeights): which Linears become MatMulNBits, their weights
within half a 4-bit step of FP32, the graph against eager, FP16 embedding scales, and the settings' checks."""

import fnmatch
import json

import numpy as np
import pytest
import torch

from edgekit.converters.quantize_executorch import QuantizeConfig, linear_names
from edgekit.converters.quantize_onnx import OnnxWeights, linear_name, quantize_onnx
from edgekit.modeling.model import JointModel, ModelConfig

T = 12
WEIGHT4 = ["*.fc1", "*.fc2", "*.attn.*"]  # the layers' Linears of devices/android.toml's weight4


def tiny():
    torch.manual_seed(0)
    return JointModel(ModelConfig(vocab_size=80, hidden=32, heads=[2, 4], ffn=[64, 48], head_dim=8, n_intents=3,
                                  n_slots=5, max_positions=64)).eval()


def inputs(n=24, seed=0):
    g = np.random.default_rng(seed)
    out = []
    for k in range(n):
        ids = g.integers(1, 80, (1, T)).astype(np.int64)
        mask = np.ones((1, T), np.int64)
        mask[0, T - 1 - k % 4:] = 0  # 1 to 4 padded pieces
        out.append([ids, mask])
    return out


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    """The tiny model's raw graph, exported once (the export is most of these tests' time)."""
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx

    path = tmp_path_factory.mktemp("onnx4") / "m.onnx"
    export_onnx(tiny(), OnnxExportConfig(T), path, inputs(4))
    return path


def nodes(path, op):
    import onnx

    return [n for n in onnx.load(str(path)).graph.node if n.op_type == op]


def attrs(node):
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_linear_name_reads_the_exporters_scopes_and_strips_the_decoding_wrapper():
    """The strings torch's exporter writes beside a node (here a decoding graph's fc1, a raw graph's intent head)."""
    from onnx import helper

    def node(scopes, classes):
        n = helper.make_node("MatMul", ["x", "w"], ["y"])
        for k, v in (("pkg.torch.onnx.name_scopes", scopes), ("pkg.torch.onnx.class_hierarchy", classes)):
            n.metadata_props.add(key=k, value=v)
        return n

    decoded = node("['', 'model', 'model.layers.0', 'model.layers.0.fc1', 'linear_4']",
                   "['edgekit.converters.decoding.DecodedModel', 'edgekit.modeling.model.JointModel', "
                   "'edgekit.modeling.model.Layer', 'torch.nn.modules.linear.Linear', 'aten.linear.default']")
    raw = node("['', 'intent_head', 'linear_24']",
               "['edgekit.modeling.model.JointModel', 'torch.nn.modules.linear.Linear', 'aten.linear.default']")
    assert linear_name(decoded) == "layers.0.fc1" and linear_name(raw) == "intent_head"
    assert linear_name(helper.make_node("MatMul", ["x", "w"], ["y"])) is None  # no scopes: matched by no pattern


def dequantized(fp32, q4) -> dict[str, np.ndarray]:
    """Each MatMulNBits (4-bit, blocks of 16) of the graph at `q4` as the FP32 weight it stands for: {the Linear's
    module name: (N, K) as torch holds it}; each checked to be `fp32`'s weight rounded to its block's step."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(fp32)).graph
    fp = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    q = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(q4)).graph.initializer}
    by_out = {n.output[0]: n for n in graph.node}  # MatMulNBits keeps its MatMul's output name
    out = {}
    for n in nodes(q4, "MatMulNBits"):
        w = fp[by_out[n.output[0]].input[1]]  # (K, N)
        K, N = w.shape
        packed, scale = q[n.input[1]], q[n.input[2]].reshape(N, -1)  # (N, blocks, 8) uint8, (N, blocks)
        vals = np.stack([packed & 0x0F, packed >> 4], -1).reshape(N, -1)[:, :K].astype(np.int32) - 8  # (N, K)
        step = np.repeat(scale, 16, axis=1)[:, :K]  # (N, K); signed: the block's largest |w| maps to -8 exactly
        assert (np.abs(vals - np.clip(w.T / step, -8, 7)) <= 0.5 + 1e-4).all()  # rounded, +7 the top of the range
        out[linear_name(by_out[n.output[0]])] = (vals * step).astype(np.float32)
    return out


def test_4bit_linears_are_the_weight4_ones_and_match_eager(fp32, tmp_path):
    """The android settings: the weight4 Linears MatMulNBits (INT8 arithmetic), the heads static INT8, the
    embedding 4-bit; the graph within a tolerance of the eager FP32 model."""
    import onnx

    from edgekit.converters.parity import compare
    from edgekit.converters.quantize_onnx import weight_matmuls
    from edgekit.runtime.backends import OnnxBackend

    m, xs = tiny(), inputs()
    graph = onnx.load(str(fp32))
    named = {linear_name(n) for n in graph.graph.node if n.name in set(weight_matmuls(graph))}
    assert named == set(linear_names(m))  # every Linear's node names its module
    want = {n for n in linear_names(m) if any(fnmatch.fnmatchcase(n, p) for p in WEIGHT4)}
    assert len(want) == 12  # two layers: query, key, value, out, fc1, fc2

    dst = tmp_path / "q4.onnx"
    rec = quantize_onnx(fp32, dst, QuantizeConfig(weight4=WEIGHT4), xs, weights=OnnxWeights(linear_bits=4, block=16))
    mm = nodes(dst, "MatMulNBits")
    assert set(dequantized(fp32, dst)) == want and rec.extra["weight4_matmuls"] == len(mm) == 12
    assert all(attrs(n)["bits"] == 4 and attrs(n)["block_size"] == 16 and attrs(n)["accuracy_level"] == 4 for n in mm)
    assert len(nodes(dst, "DequantizeLinear")) >= 2 * 2  # the two heads stay static INT8: weight and input each
    assert rec.extra["weights"] == OnnxWeights(linear_bits=4, block=16).to_dict()
    parity = compare(m, OnnxBackend(dst).run, xs)
    q8 = tmp_path / "q8.onnx"  # linear_bits 8: every Linear static INT8, as before
    quantize_onnx(fp32, q8, QuantizeConfig(weight4=WEIGHT4), xs)
    int8 = compare(m, OnnxBackend(q8).run, xs)
    # this random model's logits are about 1 in size
    assert 1e-3 < parity["max_abs_diff"] < 0.2 and int8["max_abs_diff"] < 0.2, (parity, int8)
    assert dst.stat().st_size < q8.stat().st_size


def test_4bit_weights_with_fp32_arithmetic_are_eager_with_those_weights(fp32, tmp_path):
    """Every MatMul 4-bit, FP32 products (weight-only, accuracy level 1), FP32 embeddings: the graph is the eager
    model with each Linear's weight replaced by its 4-bit value, to float rounding."""
    from edgekit.converters.parity import compare
    from edgekit.runtime.backends import OnnxBackend

    xs = inputs()
    dst = tmp_path / "all4.onnx"
    quantize_onnx(fp32, dst, QuantizeConfig(weight4=["*"], onnx_weight_only=True, embedding_bits=0), xs,
                  weights=OnnxWeights(linear_bits=4, block=16))
    m = tiny()
    weights = dequantized(fp32, dst)
    assert set(weights) == set(linear_names(m)) - {"intent_head"}  # the intent head is a Gemm: no MatMulNBits form
    with torch.no_grad():
        for name, w in weights.items():
            m.get_submodule(name).weight.copy_(torch.from_numpy(w))
    assert compare(m, OnnxBackend(dst).run, xs)["max_abs_diff"] < 1e-4
    assert compare(tiny(), OnnxBackend(dst).run, xs)["max_abs_diff"] > 1e-3  # the 4-bit weights do differ


def test_patterns_choose_the_layers_and_weight_only_keeps_fp32_arithmetic(fp32, tmp_path):
    """Only fc1 by pattern: two MatMulNBits of 4 bits; with onnx_weight_only the other MatMuls get 8-bit blocks and
    every product runs in FP32 (accuracy level 1: what the web profile relies on)."""
    xs = inputs(4)
    dst = tmp_path / "fc1.onnx"
    rec = quantize_onnx(fp32, dst, QuantizeConfig(weight4=["*.fc1"]), xs, weights=OnnxWeights(linear_bits=4))
    assert [attrs(n)["bits"] for n in nodes(dst, "MatMulNBits")] == [4, 4] and rec.extra["weight4_matmuls"] == 2
    web = tmp_path / "web.onnx"
    rec = quantize_onnx(fp32, web, QuantizeConfig(weight4=WEIGHT4, onnx_weight_only=True), xs,
                        weights=OnnxWeights(linear_bits=4, block=16))
    mm = nodes(web, "MatMulNBits")
    # the record, and report.md from it, say which bits each part got
    assert (rec.extra["weight4_matmuls"], rec.extra["weight4_block"], rec.extra["weight_bits"]) == (12, 16, 8)
    from edgekit.reporting.markdown import _quantization

    export = {"name": "export", "extra": {"onnx": {"extra": {"quantize": rec.extra}}}}
    said = "\n".join(_quantization({"passes": [export]}))
    assert "12 with 4-bit weights in blocks of 16 and the rest with 8-bit weights" in said, said
    assert sorted(attrs(n)["bits"] for n in mm) == [4] * 12 + [8]  # the slot head 8-bit; the intent Gemm FP32
    assert {attrs(n)["accuracy_level"] for n in mm} == {1} and not nodes(web, "DequantizeLinear")
    same = quantize_onnx(fp32, tmp_path / "w8.onnx", QuantizeConfig(weight4=WEIGHT4, onnx_weight_only=True), xs)
    assert same.extra["weight4_matmuls"] == 0 and not same.warnings  # linear_bits 8: the web profile's graph
    none = quantize_onnx(fp32, tmp_path / "none.onnx", QuantizeConfig(weight4=["*.nothing"]), xs,
                         weights=OnnxWeights(linear_bits=4))
    assert none.extra["weight4_matmuls"] == 0 and "no MatMul matches weight4" in none.warnings[0]


def test_fp16_embedding_scales_halve_the_scales_and_answer_as_fp32_ones(fp32, tmp_path):
    import onnx

    from edgekit.runtime.backends import OnnxBackend

    xs = inputs(8)
    a, b = tmp_path / "s32.onnx", tmp_path / "s16.onnx"
    quantize_onnx(fp32, a, QuantizeConfig(embedding_group=16), xs)
    rec = quantize_onnx(fp32, b, QuantizeConfig(embedding_group=16), xs, weights=OnnxWeights(embedding_scales="fp16"))
    assert rec.extra["embedding"]["scales"] == "fp16"
    graph = onnx.load(str(b)).graph
    inits = {i.name: i for i in graph.initializer}
    gbq = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert len(gbq) == len(rec.extra["embedding"]["tables"]) >= 1
    assert all(inits[n.input[2]].data_type == onnx.TensorProto.FLOAT16 for n in gbq)
    casts = {n.input[0] for n in graph.node if n.op_type == "Cast"}
    assert all(n.output[0] in casts for n in gbq)  # each lookup cast back to FP32
    scales = sum(int(np.prod(inits[n.input[2]].dims)) for n in gbq)
    assert scales >= 80 * 32 // 16  # the word table, 80 x 32 in groups of 16
    saved = a.stat().st_size - b.stat().st_size
    assert 2 * scales - 200 < saved <= 2 * scales  # 2 bytes a scale, less the two Cast nodes
    ra, rb = OnnxBackend(a), OnnxBackend(b)
    for x in xs:
        for p, q in zip(ra.run(*x), rb.run(*x)):
            assert np.abs(p - q).max() < 0.05  # FP16 scales: relative rounding of 2^-11 on each looked-up value


@pytest.mark.parametrize("bad,field", [({"linear_bits": 3}, "linear_bits"), ({"block": 24}, "block"),
                                       ({"block": 8}, "block"), ({"accuracy_level": 2}, "accuracy_level"),
                                       ({"embedding_scales": "bf16"}, "embedding_scales")])
def test_onnx_weights_refuse_bad_values_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        OnnxWeights(**bad)


def test_onnx_weights_round_trip_through_json():
    w = OnnxWeights(linear_bits=4, block=64, accuracy_level=1, embedding_scales="fp16")
    assert OnnxWeights(**json.loads(json.dumps(w.to_dict()))) == w
    assert OnnxWeights().to_dict() == {"linear_bits": 8, "block": 32, "accuracy_level": 4, "embedding_scales": "fp32"}
