"""distill.teacher: a student pruned from the build's own teacher (a tiny BERT) learns from another base model (a tiny
MPNet, wider), whose teacher is the one a server build of that model trains (one cache entry for both), and whose
outputs on the augmented utterances are kept, so that another distill.seed labels nothing again."""

import json

import pytest

from edgekit.converters.distill import uniform_layers
from edgekit.data.dataset import load_dataset
from edgekit.engine import BuildConfig, build
from edgekit.engine.keys import key_of
from edgekit.engine.runner import prepare
from edgekit.errors import EdgekitError
from tests.conftest import DEMO, need_module

need_module("transformers", "the dev extra (transformers' MPNet writes the tiny checkpoint)")
from tests.modeling.test_mpnet import write_tiny_mpnet  # noqa: E402

TEACHER = {"epochs": 3, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2}
FAST = {"teacher": TEACHER, "package": {"bench_utterances": 0}, "decoding": {"compare_argmax": False}}
PHONE = """name = "test-phone"
description = "test profile"
runtimes = ["onnx"]
primary_runtime = "onnx"
stages = ["teacher", "trim_vocab", "prune", "distill", "export", "package"]
[budget]
intent_drop_pts = 100.0
slot_f1_drop_pts = 100.0
[compress]
vocab_budget = 330
param_share = 0.5
max_retries = 0
[distill]
epochs = 2
lr = 0.005
augment = 0.5
"""


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    words = {w.lower() for line in DEMO.read_text().splitlines() for w in json.loads(line)["text"].split()}
    folder = tmp_path_factory.mktemp("wide_mpnet")
    write_tiny_mpnet(folder, words=words, hidden=48, layers=3)
    return folder


def passes(rep):
    return {p["name"]: p for p in rep["passes"]}


def test_a_wider_teacher_of_another_family_teaches_the_student_and_is_shared(tmp_path, tiny_bert, mpnet):
    (tmp_path / "phone.toml").write_text(PHONE)
    rows = []
    cfg = BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert),
                      target=str(tmp_path / "phone.toml"), settings=FAST, sets=[f'distill.teacher="{mpnet}"'])
    rep = build(cfg, on_stage=lambda name, row: rows.append((name, row)))
    # the MPNet teacher is trained under the key a server build of it computes: one training for both
    server = prepare(BuildConfig(data=str(DEMO), out=str(tmp_path / "srv"), base_model=str(mpnet), target="server-cpu",
                                 settings=FAST))
    server_key = key_of(server, "teacher", server.input_digest)[:12]
    assert rows[0][0] == f"teacher {mpnet}" and not rows[0][1]["reused"] and rows[0][1]["key"] == server_key
    d = passes(rep)["distill"]["extra"]
    assert d["teacher"]["key"] == server_key and d["teacher"]["targets_reused"] is False
    assert d["teacher"]["dev"]["n"] == len(server.data.splits["dev"])
    student_layers = len(d["layer_map"])
    assert d["layer_map"] == uniform_layers(3, student_layers)  # 3 MPNet layers met evenly by the student's
    assert d["hidden_projection"] == [32, 48] and d["augmented"] > 0
    assert f"taught by `{mpnet}` (teacher {server_key}" in (tmp_path / "o" / "report.md").read_text()
    # another student seed on the same teachers: both teachers, trim and prune reused, the MPNet outputs too
    rows.clear()
    again = build(BuildConfig(**{**cfg.__dict__, "sets": cfg.sets + ["distill.seed=7"]}),
                  on_stage=lambda name, row: rows.append((name, row)))
    assert rows[0][1]["reused"] and [s["reused"] for s in again["stages"]] == [True, True, True, False, False, False]
    d2 = passes(again)["distill"]["extra"]
    assert d2["teacher"]["targets_reused"] is True and d2["teacher"]["targets_key"] == d["teacher"]["targets_key"]
    # the build's own teacher teaches otherwise: another distillation, its layers as pruning kept them
    own = build(BuildConfig(**{**cfg.__dict__, "sets": []}))
    assert [s["reused"] for s in own["stages"]][:3] == [True, True, True] and not own["stages"][3]["reused"]
    own_distill = passes(own)["distill"]["extra"]
    assert "teacher" not in own_distill and own_distill["hidden_projection"] is None


def test_an_unknown_distill_teacher_is_one_line_before_any_work(tmp_path, tiny_bert):
    with pytest.raises(EdgekitError, match=r"^distill.teacher nosuch: neither a folder nor one of minilm, mpnet$"):
        build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert), target="web",
                          sets=["distill.teacher=nosuch"]))
    assert not (tmp_path / "o" / "report.json").exists()


def test_a_teacher_assistant_learns_from_the_strong_teacher_and_teaches_the_student(tmp_path, tiny_bert, mpnet):
    """distill.assistant: the build's own teacher, fine-tuned as it would be alone (its own cache entry), learns from
    the MPNet teacher; the student is pruned from it and learns from it, with unlabelled utterances beside."""
    (tmp_path / "phone.toml").write_text(PHONE)
    logs = tmp_path / "logs.txt"
    dev = " ".join(load_dataset(DEMO).splits["dev"][0].words).upper()  # a dev utterance: dropped, never trained on
    logs.write_text(f"play some jazz\n\nwhat is the weather in paris\n{dev}\n")
    base = dict(data=str(DEMO), base_model=str(tiny_bert), target=str(tmp_path / "phone.toml"), settings=FAST)
    plain = prepare(BuildConfig(out=str(tmp_path / "p"), **base))
    plain_key = key_of(plain, "teacher", plain.input_digest)
    rows = []
    sets = [f'distill.teacher="{mpnet}"', "distill.assistant=true", "distill.assistant_epochs=1",
            f'distill.unlabelled="{logs}"']
    rep = build(BuildConfig(out=str(tmp_path / "o"), sets=sets, **base),
                on_stage=lambda name, row: rows.append((name, row)))
    keys = dict((name, row["key"]) for name, row in rows)
    a = passes(rep)["teacher"]["extra"]["assistant"]
    assert a["taught_by"]["key"] == keys[f"teacher {mpnet}"] and a["fine_tuned"]["key"] == plain_key[:12]
    assert keys["teacher"] != plain_key[:12] and a["epochs"] == 1 and a["hidden_weight"] == 0.0
    d = passes(rep)["distill"]["extra"]
    assert "teacher" not in d and d["hidden_projection"] is None  # taught by the assistant
    assert d["unlabelled"] == 2 and d["unlabelled_dropped"] == 1
    md = (tmp_path / "o" / "report.md").read_text()
    assert f"**teacher assistant**: the fine-tuned teacher ({plain_key[:12]}" in md and "2 unlabelled utterances" in md
    # the fine-tuned teacher the assistant started from is the plain build's: reused, not trained again
    alone = build(BuildConfig(out=str(tmp_path / "p"), **base))
    assert alone["stages"][0]["reused"] and passes(alone)["teacher"]["extra"].get("assistant") is None


def test_a_bad_unlabelled_file_is_refused_before_any_training(tmp_path, tiny_bert):
    logs = tmp_path / "logs.txt"
    logs.write_bytes(b"play some jazz\nbad \xff byte\n")
    with pytest.raises(EdgekitError, match=r"logs.txt:2: not valid UTF-8"):
        build(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert), target="web",
                          sets=[f'distill.unlabelled="{logs}"']))
    assert not (tmp_path / "o" / "report.json").exists()
