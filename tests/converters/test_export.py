import numpy as np
import pytest
import torch

from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx
from edgekit.modeling.model import JointModel, ModelConfig

L = 16


def tiny(n_slots=5, word_pool=False):
    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=60, hidden=16, heads=[2, 4], ffn=[32, 16], head_dim=4, n_intents=3,
                               n_slots=n_slots)).eval()
    if word_pool:
        from edgekit.modeling.model import enable_word_pool

        enable_word_pool(m, [i % 3 == 0 for i in range(60)])  # a third of the pieces continue a word
    return m


def inputs(n=4):
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        ids = rng.integers(4, 60, (1, L)).astype(np.int64)
        mask = np.ones((1, L), dtype=np.int64)
        mask[0, 5 + k:] = 0
        out.append((ids, mask))
    return out


@pytest.mark.parametrize("n_slots", [5, 0])
def test_executorch_export_matches_eager(tmp_path, n_slots):
    rec = export_executorch(tiny(n_slots), ExecuTorchExportConfig(L), tmp_path / "m.pte", inputs())
    p = rec.extra["parity"]
    assert (tmp_path / "m.pte").stat().st_size == rec.bytes_after > 0
    assert p["max_abs_diff"] < 1e-4 and p["intent_argmax_agree"] == 1.0
    assert p["slot_argmax_agree"] == (1.0 if n_slots else None)
    assert rec.extra["delegate_calls"] >= 1


@pytest.mark.parametrize("n_slots", [5, 0])
def test_onnx_export_matches_eager(tmp_path, n_slots):
    rec = export_onnx(tiny(n_slots), OnnxExportConfig(L), tmp_path / "m.onnx", inputs())
    assert rec.extra["parity"]["max_abs_diff"] < 1e-4 and rec.extra["parity"]["intent_argmax_agree"] == 1.0
    import onnx

    g = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [d.dim_value for d in g.input[0].type.tensor_type.shape.dim] == [1, L]  # fixed shape
    assert [o.name for o in g.output] == (["intent_logits", "slot_logits"] if n_slots else ["intent_logits"])


def test_word_pooled_model_exports_to_both_runtimes(tmp_path):
    m = tiny(word_pool=True)
    ids = torch.tensor(inputs()[0][0])
    assert not torch.equal(m(ids, torch.ones_like(ids))[1], tiny()(ids, torch.ones_like(ids))[1])  # pooling acts
    rec = export_executorch(m, ExecuTorchExportConfig(L), tmp_path / "m.pte", inputs())
    assert rec.extra["parity"]["max_abs_diff"] < 1e-4 and rec.extra["parity"]["slot_argmax_agree"] == 1.0
    # The pooling after the word-number cumsum is elementwise ops and matmuls: XNNPACK takes all of it.
    assert not {"aten.eq.Tensor", "aten.sum.dim_IntList", "aten.bmm.default"} & set(rec.extra["undelegated_ops"])
    rec = export_onnx(m, OnnxExportConfig(L), tmp_path / "m.onnx", inputs())
    assert rec.extra["parity"]["max_abs_diff"] < 1e-4 and rec.extra["parity"]["slot_argmax_agree"] == 1.0


def test_parity_detects_a_wrong_artifact():
    from edgekit.converters.parity import compare

    m = tiny()

    def artifact(model):  # an "exported" model: the eager module run on numpy arrays
        return lambda ids, mask: [o.detach().numpy() for o in model(torch.from_numpy(ids), torch.from_numpy(mask))]

    right = compare(m, artifact(m), inputs(8))
    assert right["max_abs_diff"] == 0 and right["intent_argmax_agree"] == 1 and right["slot_argmax_agree"] == 1
    wrong = tiny()  # the same architecture, other weights: what a mixed-up export would ship
    with torch.no_grad():
        for p in wrong.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    res = compare(m, artifact(wrong), inputs(8))
    assert res["max_abs_diff"] > 0.1 and res["slot_argmax_agree"] < 0.9


def test_export_config_validates():
    with pytest.raises(ValueError):
        ExecuTorchExportConfig(0)
    with pytest.raises(ValueError):
        OnnxExportConfig(16, opset=11)
