import copy

import pytest
import torch

from edgekit.converters.distill import DistillConfig, DistillInputs, distill, kd_loss
from edgekit.data.dataset import load_dataset
from edgekit.modeling.model import JointModel, ModelConfig, gather_embeddings
from edgekit.scoring.score import labels_of
from edgekit.text.vocab import from_wordpiece

from ..conftest import DEMO, make_vocab


def test_kd_loss_is_zero_for_identical_soft_targets_and_no_hard_part():
    s = torch.randn(4, 6)
    assert kd_loss(s, s.clone(), torch.full((4,), -100), 4.0, 1.0).abs() < 1e-6
    assert kd_loss(s, s.clone(), torch.zeros(4, dtype=torch.long), 4.0, 0.5) > 0


def teacher_and_student():
    """The demo data, its tokenizer, a random 2-layer teacher (eval mode) and a random 1-layer student."""
    data = load_dataset(DEMO)
    words = {w.lower() for ex in data.splits["train"] for w in ex.words}
    tok, rows = from_wordpiece(make_vocab(sorted(words)))

    def model(layers):
        torch.manual_seed(layers)
        m = JointModel(ModelConfig(vocab_size=len(make_vocab(sorted(words))), hidden=32, heads=[4] * layers,
                                   ffn=[64] * layers, head_dim=8, n_intents=len(data.intents),
                                   n_slots=len(data.slot_tags), dropout=0.0))
        gather_embeddings(m, rows)
        return m

    return data, tok, model(2).eval(), model(1)


def test_distill_trains_student_towards_teacher():
    data, tok, teacher, student = teacher_and_student()
    labels = labels_of(data)
    inputs = DistillInputs(teacher=teacher, teacher_tokenizer=tok, student_tokenizer=tok,
                           train=data.splits["train"][:200], dev=data.splits["dev"], labels=labels, max_len=32)
    res = distill(student, inputs, DistillConfig(epochs=2, lr=3e-3, augment=0.0, novel=0.0))
    new, rec = res.model, res.record
    curve = rec.extra["curve"]
    assert len(curve) == 2 and curve[-1]["train_loss"] < curve[0]["train_loss"]
    assert rec.extra["temperature"] == 4.0 and rec.extra["alpha"] == 0.7
    ids = torch.tensor([tok.encode("set an alarm for 7 am", 32).input_ids])
    assert all(torch.isfinite(o).all() for o in new(ids, torch.ones_like(ids)))
    with pytest.raises(ValueError):
        DistillConfig(alpha=1.5)


def test_novel_words_are_whole_for_the_teacher_and_split_for_the_student():
    from edgekit.converters.distill import novel_words

    teacher, _ = from_wordpiece(make_vocab(["play", "queen", "zeppelin", "abba"]))
    student, _ = from_wordpiece(make_vocab(["play", "queen"]))
    assert sorted(novel_words(teacher, student)) == ["abba", "zeppelin"]
    assert novel_words(teacher, teacher) == []


def one_layer_self_distillation(**kw):
    """Distil a tiny one-layer model into a copy of itself on the demo data; returns (student, record)."""
    data = load_dataset(DEMO)
    words = {w.lower() for ex in data.splits["train"] for w in ex.words}
    tok, rows = from_wordpiece(make_vocab(sorted(words)))
    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=len(make_vocab(sorted(words))), hidden=16, heads=[2], ffn=[32], head_dim=8,
                               n_intents=len(data.intents), n_slots=len(data.slot_tags), dropout=0.0))
    gather_embeddings(m, rows)
    evaluate = kw.pop("evaluate", None)
    inputs = DistillInputs(teacher=m.eval(), teacher_tokenizer=tok, student_tokenizer=tok,
                           train=data.splits["train"][:100], dev=data.splits["dev"][:20], labels=labels_of(data),
                           max_len=32, evaluate=evaluate)
    res = distill(copy.deepcopy(m), inputs, DistillConfig(**{"hidden_weight": 0.0, "augment": 0.0, "novel": 0.0, **kw}))
    return res.model, res.record


def test_distill_with_augmentation_adds_labelled_utterances():
    _, rec = one_layer_self_distillation(epochs=1, augment=0.5)
    assert rec.extra["augmented"] == 50


def test_distill_keeps_the_epoch_its_evaluate_scores_best():
    calls = []

    def evaluate(model):  # scores epoch 2 best, whatever the model does
        calls.append(copy.deepcopy(model.state_dict()))
        return {"intent_acc": 1.0 if len(calls) == 2 else 0.5, "slot_f1": 0.5, "slot_f1_argmax": 0.4,
                "exact_match": 0.5}

    model, rec = one_layer_self_distillation(epochs=3, lr=3e-2, evaluate=evaluate)
    assert len(calls) == 3 and rec.extra["best_epoch"] == 2
    assert rec.extra["curve"][1]["dev"]["slot_f1_argmax"] == 0.4
    assert all(torch.equal(v, calls[1][k]) for k, v in model.state_dict().items())
    assert not all(torch.equal(v, calls[2][k]) for k, v in model.state_dict().items())


def test_continues_word_flags_pieces_inside_words_only():
    from edgekit.converters.distill import continues_word

    tok, _ = from_wordpiece(make_vocab(["play", "kelis"]))
    flags = continues_word(tok)
    piece = {tok.sp.id_to_piece(i): f for i, f in enumerate(flags)}
    assert len(flags) == tok.vocab_size
    assert not piece["▁play"] and not piece["[CLS]"] and not piece["<pad>"] and piece["<0x41>"]
    ids = tok.word_ids("kelisplay")  # a word the vocabulary splits: only its first piece starts it
    assert len(ids) > 1 and [flags[i] for i in ids] == [False] + [True] * (len(ids) - 1)


def test_distill_with_word_pool_gives_a_pooled_student():
    student, rec = one_layer_self_distillation(epochs=1, word_pool=True)
    assert student.cfg.word_pool and student.cont.shape == (student.cfg.vocab_size,) and student.cont.sum() > 0
    assert rec.extra["curve"][0]["train_loss"] > 0


@pytest.mark.parametrize("bf16", [False, True])
def test_distill_matches_hidden_states_in_fp32_and_bf16(bf16):
    """bf16 autocast (distill.bf16, off by default) with hidden-state matching: the teacher's stored FP16
    states and the student's bf16 ones meet in an FP32 loss, which falls."""
    data, tok, teacher, student = teacher_and_student()
    inputs = DistillInputs(teacher=teacher, teacher_tokenizer=tok, student_tokenizer=tok,
                           train=data.splits["train"][:150], dev=data.splits["dev"][:20], labels=labels_of(data),
                           max_len=32, layer_map=[2])
    rec = distill(student, inputs, DistillConfig(epochs=2, lr=3e-3, augment=0.0, novel=0.0, bf16=bf16)).record
    curve = rec.extra["curve"]
    assert rec.extra["hidden_weight"] == 1.0 and curve[-1]["train_loss"] < curve[0]["train_loss"]


def test_distill_augments_intent_only_data_by_replacing_words():
    from edgekit.data.dataset import Example

    data = load_dataset(DEMO)
    plain = [Example(ex.words, ex.intent) for ex in data.splits["train"][:100]]
    words = {w.lower() for ex in data.splits["train"] for w in ex.words}
    tok, rows = from_wordpiece(make_vocab(sorted(words)))
    torch.manual_seed(0)
    m = JointModel(ModelConfig(vocab_size=len(make_vocab(sorted(words))), hidden=16, heads=[2], ffn=[32], head_dim=8,
                               n_intents=len(data.intents), n_slots=0, dropout=0.0))
    gather_embeddings(m, rows)
    labels = {"intents": data.intents, "slot_tags": [], "oos_label": None}
    inputs = DistillInputs(teacher=m.eval(), teacher_tokenizer=tok, student_tokenizer=tok, train=plain,
                           dev=[Example(ex.words, ex.intent) for ex in data.splits["dev"][:20]], labels=labels,
                           max_len=32)
    rec = distill(copy.deepcopy(m), inputs, DistillConfig(epochs=1, augment=0.5, hidden_weight=0.0)).record
    assert rec.extra["augmented"] == 50


def test_distill_from_a_wider_deeper_mpnet_teacher_with_another_tokenizer():
    """Across architectures and tokenizers: a 4-layer, 32-wide MPNet-style teacher (relative bias, no token types)
    over a larger vocabulary teaches a 2-layer, 16-wide BERT student; hidden states meet through learned projections
    that the student does not keep."""
    from edgekit.converters.distill import uniform_layers

    data = load_dataset(DEMO)
    labels = labels_of(data)
    words = sorted({w.lower() for ex in data.splits["train"] for w in ex.words})
    t_tok, t_rows = from_wordpiece(make_vocab(words))
    s_tok, s_rows = from_wordpiece(make_vocab(words[::2]))  # the student's vocabulary splits every other word
    torch.manual_seed(0)
    teacher = JointModel(ModelConfig(vocab_size=len(make_vocab(words)), hidden=32, heads=[4] * 4, ffn=[64] * 4,
                                     head_dim=8, n_intents=len(data.intents), n_slots=len(data.slot_tags), dropout=0.0,
                                     token_types=False, rel_buckets=32))
    gather_embeddings(teacher, t_rows)
    student = JointModel(ModelConfig(vocab_size=len(make_vocab(words[::2])), hidden=16, heads=[2] * 2, ffn=[32] * 2,
                                     head_dim=8, n_intents=len(data.intents), n_slots=len(data.slot_tags), dropout=0.0))
    gather_embeddings(student, s_rows)
    keys = set(student.state_dict())
    assert uniform_layers(4, 2) == [2, 4] and uniform_layers(12, 4) == [3, 6, 9, 12]
    inputs = DistillInputs(teacher=teacher.eval(), teacher_tokenizer=t_tok, student_tokenizer=s_tok,
                           train=data.splits["train"][:150], dev=data.splits["dev"][:20], labels=labels, max_len=32,
                           layer_map=uniform_layers(4, 2))
    res = distill(student, inputs, DistillConfig(epochs=2, lr=3e-3, augment=0.0, novel=0.0))
    curve = res.record.extra["curve"]
    assert res.record.extra["hidden_projection"] == [16, 32] and res.record.extra["hidden_weight"] == 1.0
    assert curve[-1]["train_loss"] < curve[0]["train_loss"]
    assert set(res.model.state_dict()) == keys  # the projections are not the student's


def test_relation_loss_compares_words_within_each_utterance_only():
    """Relations are a softmax over the words of the same utterance: equal states give 0, another utterance's words
    never enter, a change does, and a teacher of another width needs no projection."""
    from edgekit.converters.distill import relation_loss

    torch.manual_seed(0)
    b_idx = torch.tensor([0, 0, 0, 1, 1])
    s = torch.randn(5, 8)
    assert relation_loss(s, s.clone(), b_idx, 2).abs() < 1e-6
    assert relation_loss(s, torch.randn(5, 8), b_idx, 2) > 0
    moved = s.clone()
    moved[3:] = torch.randn(2, 8)  # utterance 1 changes: utterance 0's rows keep a loss of 0
    per_row = lambda st, tt: relation_loss(st[:3], tt[:3], b_idx[:3], 2)  # noqa: E731
    assert per_row(s, moved).abs() < 1e-6 and relation_loss(s, moved, b_idx, 2) > 0
    assert relation_loss(s, torch.randn(5, 16), b_idx, 2) > 0  # (5, 16): twice as wide
    with pytest.raises(ValueError, match="does not divide"):
        relation_loss(s, s, b_idx, 3)


def test_distill_with_relations_alone_from_a_wider_teacher():
    """relation_weight > 0 with hidden_weight 0: relations only, no projection, and the loss falls."""
    data = load_dataset(DEMO)
    words = sorted({w.lower() for ex in data.splits["train"] for w in ex.words})
    tok, rows = from_wordpiece(make_vocab(words))

    def model(hidden, layers):
        torch.manual_seed(layers)
        m = JointModel(ModelConfig(vocab_size=len(make_vocab(words)), hidden=hidden, heads=[4] * layers,
                                   ffn=[64] * layers, head_dim=hidden // 4, n_intents=len(data.intents),
                                   n_slots=len(data.slot_tags), dropout=0.0))
        gather_embeddings(m, rows)
        return m

    inputs = DistillInputs(teacher=model(32, 2).eval(), teacher_tokenizer=tok, student_tokenizer=tok,
                           train=data.splits["train"][:150], dev=data.splits["dev"][:20], labels=labels_of(data),
                           max_len=32, layer_map=[2])
    rec = distill(model(16, 1), inputs, DistillConfig(epochs=2, lr=3e-3, augment=0.0, novel=0.0, hidden_weight=0.0,
                                                      relation_weight=1.0, relation_heads=4)).record
    assert rec.extra["relation_weight"] == 1.0 and rec.extra["hidden_projection"] is None
    assert rec.extra["curve"][-1]["train_loss"] < rec.extra["curve"][0]["train_loss"]
    with pytest.raises(ValueError):
        DistillConfig(relation_weight=-1.0)


def test_unlabelled_utterances_have_no_gold_labels_only_the_teachers():
    """Unlabelled utterances join the pool with no hard target: with alpha 0 (gold labels alone) they teach nothing
    and the student stays as it was; with alpha 1 the teacher's outputs on them move it."""
    data, tok, teacher, student = teacher_and_student()
    unlabelled = [type(ex)(ex.words, None) for ex in data.splits["dev"]]  # words only
    inputs = DistillInputs(teacher=teacher, teacher_tokenizer=tok, student_tokenizer=tok, train=[],
                           dev=data.splits["dev"][:20], labels=labels_of(data), max_len=32, unlabelled=unlabelled)
    before = copy.deepcopy(student.state_dict())

    def run(alpha):
        res = distill(copy.deepcopy(student), inputs, DistillConfig(epochs=1, lr=3e-3, augment=0.0, novel=0.0,
                                                                    alpha=alpha, weight_decay=0.0))
        moved = max((res.model.state_dict()[k] - v).abs().max().item() for k, v in before.items())
        return moved, res.record

    moved, rec = run(0.0)
    assert moved == 0.0 and rec.extra["unlabelled"] == len(unlabelled) > 20 and rec.extra["augmented"] == 0
    assert run(1.0)[0] > 1e-4


def test_assistant_and_unlabelled_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="assistant needs a teacher"):
        DistillConfig(assistant=True)
    with pytest.raises(ValueError, match="unlabelled: file not found"):
        DistillConfig(unlabelled=str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="assistant_epochs"):
        DistillConfig(teacher="mpnet", assistant=True, assistant_epochs=0)
