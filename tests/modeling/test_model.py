import pytest
import torch

from edgekit.errors import EdgekitError
from edgekit.modeling.model import JointModel, ModelConfig, count_params, load_model, save_model
from edgekit.modeling.pretrained import load_pretrained


def test_forward_shapes_and_padding_invariance():
    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=50, hidden=16, heads=[2, 4], ffn=[32, 8], head_dim=4, n_intents=3,
                               n_slots=5)).eval()
    ids = torch.randint(4, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    intent, slots = m(ids, mask)
    assert intent.shape == (2, 3) and slots.shape == (2, 7, 5)
    # padding a sequence must not change the answers at its real positions
    ids_p = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], 1)
    mask_p = torch.cat([mask, torch.zeros(2, 3, dtype=torch.long)], 1)
    intent_p, slots_p = m(ids_p, mask_p)
    assert torch.allclose(intent, intent_p, atol=1e-5) and torch.allclose(slots, slots_p[:, :7], atol=1e-5)


def test_intent_only_model_has_no_slot_head():
    m = JointModel(ModelConfig(vocab_size=20, hidden=8, heads=[2], ffn=[16], head_dim=4, n_intents=4))
    out = m(torch.ones(1, 5, dtype=torch.long), torch.ones(1, 5, dtype=torch.long))
    assert len(out) == 1 and m.slot_head is None


def test_load_pretrained_copies_every_encoder_weight(tiny_bert):
    from safetensors import safe_open

    m = load_pretrained(tiny_bert, n_intents=3, n_slots=4)
    with safe_open(str(tiny_bert / "model.safetensors"), "pt") as f:
        assert torch.equal(m.layers[1].fc2.weight, f.get_tensor("encoder.layer.1.output.dense.weight"))
        assert torch.equal(m.type_emb, f.get_tensor("embeddings.token_type_embeddings.weight")[0])
    assert count_params(m, embeddings=False) < count_params(m)


def test_load_pretrained_rejects_incomplete_folder(tmp_path):
    with pytest.raises(EdgekitError, match="config.json: missing"):
        load_pretrained(tmp_path, 2, 0)


def test_save_load_roundtrip(tmp_path):
    m = JointModel(ModelConfig(vocab_size=20, hidden=8, heads=[2, 1], ffn=[16, 4], head_dim=4, n_intents=4,
                               n_slots=3)).eval()
    save_model(m, tmp_path / "m.safetensors")
    m2 = load_model(tmp_path / "m.safetensors")
    assert m2.cfg == m.cfg
    x = torch.randint(0, 20, (1, 6))
    assert torch.equal(m(x, torch.ones_like(x))[1], m2(x, torch.ones_like(x))[1])


def test_factorized_embedding_is_exact_at_full_rank_and_smaller_below(tmp_path):
    from edgekit.modeling.model import factorize_embeddings

    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=30, hidden=8, heads=[2], ffn=[16], head_dim=4, n_intents=2)).eval()
    x = torch.randint(0, 30, (2, 5))
    ref = m(x, torch.ones_like(x))[0]
    full = JointModel(m.cfg)
    full.load_state_dict(m.state_dict())
    assert factorize_embeddings(full.eval(), 8) == 1.0  # rank >= hidden: nothing to do
    low = JointModel(ModelConfig(**{**m.cfg.__dict__}))
    low.load_state_dict(m.state_dict())
    energy = factorize_embeddings(low.eval(), 7)
    assert 0 < energy < 1 and low.word_emb.weight.shape == (30, 7) and low.word_proj.weight.shape == (8, 7)
    assert count_params(low, embeddings=False) == count_params(m, embeddings=False)
    assert torch.isfinite(low(x, torch.ones_like(x))[0]).all() and not torch.equal(low(x, torch.ones_like(x))[0], ref)
    save_model(low, tmp_path / "low.safetensors")
    assert load_model(tmp_path / "low.safetensors").cfg.emb_rank == 7


def test_word_pool_feeds_the_slot_head_each_words_mean(tmp_path):
    from edgekit.modeling.model import enable_word_pool

    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=12, hidden=8, heads=[2], ffn=[16], head_dim=4, n_intents=2,
                               n_slots=3)).eval()
    ids = torch.tensor([[2, 4, 5, 9, 6, 3, 0]])  # [CLS] w0 w1(5 + 9) w2 [SEP] pad; piece 9 continues a word
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    plain = m(ids, mask)[1]
    with pytest.raises(ValueError, match="piece flags"):
        enable_word_pool(m, [False] * 5)
    enable_word_pool(m, [i == 9 for i in range(12)])
    intent, pooled = m(ids, mask)
    h = m.encode(ids, mask)[-1]
    assert torch.allclose(pooled[0, 2], m.slot_head(h[0, 2:4].mean(0)), atol=1e-5)  # the split word: its mean
    assert torch.allclose(pooled[0, [1, 4]], plain[0, [1, 4]], atol=1e-5)  # one-piece words: unchanged
    save_model(m, tmp_path / "m.safetensors")
    m2 = load_model(tmp_path / "m.safetensors")
    assert m2.cfg.word_pool and torch.equal(m2(ids, mask)[1], pooled)
    from edgekit.modeling.model import gather_embeddings

    gather_embeddings(m2, [0, 9, 2])  # a vocabulary trimmed later keeps each kept piece's flag
    assert m2.cont.tolist() == [0.0, 1.0, 0.0] and m2.cfg.vocab_size == 3


def test_dropout_drops_at_its_rate_scales_the_rest_and_is_identity_in_eval():
    from edgekit.modeling.model import Dropout

    torch.manual_seed(0)
    d = Dropout(0.1)
    x = torch.ones(200_000)
    y = d(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 26 / 256) < 0.004, dropped  # the rate in steps of 1/256
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 256 / 230))  # the mean is kept
    assert abs(y.mean().item() - 1.0) < 0.01
    torch.manual_seed(0)
    assert torch.equal(d(x), y)  # torch's generator: seeded runs repeat
    assert not torch.equal(d(x), y)
    assert d.eval()(x) is x and Dropout(0.0).train()(x) is x
    z = Dropout(0.5)(torch.ones(3, 5, 7))
    assert z.shape == (3, 5, 7) and set(z.unique().tolist()) <= {0.0, 2.0}
