import torch

from edgekit.converters.prune import PruneConfig, apply_plan, prune
from edgekit.modeling.model import JointModel, ModelConfig, count_params
from edgekit.modeling.training import joint_loss


def tiny():
    torch.manual_seed(0)
    return JointModel(ModelConfig(vocab_size=40, hidden=16, heads=[4, 4, 4], ffn=[32, 32, 32], head_dim=4,
                                  n_intents=3, n_slots=5, dropout=0.0)).eval()


def batches(n=3):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(4, 40, (8, 10), generator=g)
        out.append((ids, torch.ones_like(ids), torch.randint(0, 3, (8,), generator=g),
                    torch.randint(0, 5, (8, 10), generator=g)))
    return out


def run_prune(m, target, drop_layers=0):
    res = prune(m, batches(), lambda o, i, s: joint_loss(o, i, s, 1.0), PruneConfig(target, drop_layers=drop_layers))
    return res.model, res.record


def test_prune_makes_a_smaller_real_module():
    m = tiny()
    before = count_params(m, embeddings=False)
    new, rec = run_prune(m, before // 2)
    assert count_params(new, embeddings=False) <= before // 2
    assert rec.extra["nonembedding_after"] == count_params(new, embeddings=False)
    assert sum(new.cfg.heads) < 12 and sum(new.cfg.ffn) < 96
    for layer in new.layers:  # weights really shrank
        if layer.attn is not None:
            assert layer.attn.query.weight.shape[0] == layer.attn.heads * 4
    ids = torch.randint(4, 40, (2, 10))
    outs = new(ids, torch.ones_like(ids))
    assert all(torch.isfinite(o).all() for o in outs) and outs[1].shape == (2, 10, 5)
    assert rec.params_after < rec.params_before and rec.seconds > 0


def test_layer_pruning_drops_the_least_sensitive_layer():
    m = tiny()
    target = int(count_params(m, embeddings=False) * 0.4)
    new, rec = run_prune(m, target, drop_layers=1)
    sens = rec.extra["layer_sensitivity"]
    assert new.cfg.layers == 2 and rec.extra["layers_after"] == 2
    assert sens.index(min(sens)) not in rec.extra["kept_layers"]
    assert count_params(new, embeddings=False) <= target
    ids = torch.randint(4, 40, (1, 6))
    assert torch.isfinite(new(ids, torch.ones_like(ids))[0]).all()


def test_keeping_everything_is_exact():
    m = tiny()
    same = apply_plan(m, [list(range(4))] * 3, [list(range(32))] * 3).eval()
    ids = torch.randint(4, 40, (2, 7))
    for a, b in zip(m(ids, torch.ones_like(ids)), same(ids, torch.ones_like(ids))):
        assert torch.allclose(a, b, atol=1e-6)


def test_uneven_heads_export_cleanly(tmp_path):
    import numpy as np

    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch

    m = apply_plan(tiny(), [[0, 2], [], [1, 2, 3]], [list(range(5)), list(range(32)), []]).eval()
    assert m.cfg.heads == [2, 0, 3] and m.cfg.ffn == [5, 32, 0]
    inputs = [(np.random.default_rng(0).integers(4, 40, (1, 12)).astype(np.int64), np.ones((1, 12), np.int64))]
    rec = export_executorch(m, ExecuTorchExportConfig(12), tmp_path / "m.pte", inputs)
    assert rec.extra["parity"]["max_abs_diff"] < 1e-4
