import json

import pytest

from edgekit.data import detect_format, load_dataset, stratified_split
from edgekit.errors import DataError, EdgekitError


def write_jointbert(root, split, lines_in, lines_out, labels):
    d = root / split
    d.mkdir(parents=True)
    (d / "seq.in").write_text("\n".join(lines_in) + "\n")
    if lines_out is not None:
        (d / "seq.out").write_text("\n".join(lines_out) + "\n")
    (d / "label").write_text("\n".join(labels) + "\n")


def small_jointbert(tmp_path, with_dev_test=True):
    ins = ["play queen", "play the beatles now", "rain in paris", "weather in oslo today"] * 3
    outs = ["O B-artist", "O B-artist I-artist O", "O O B-city", "O O B-city B-date"] * 3
    labels = ["Play", "Play", "Weather", "Weather"] * 3
    write_jointbert(tmp_path, "train", ins, outs, labels)
    if with_dev_test:
        write_jointbert(tmp_path, "dev", ins[:4], outs[:4], labels[:4])
        write_jointbert(tmp_path, "test", ins[:4], outs[:4], labels[:4])
    return tmp_path


def test_jointbert_parses_words_tags_and_labels(tmp_path):
    ds = load_dataset(small_jointbert(tmp_path))
    assert ds.format == "jointbert" and ds.has_slots
    assert ds.intents == ["Play", "Weather"]
    assert ds.slot_tags[0] == "O" and "B-artist" in ds.slot_tags and "I-city" in ds.slot_tags
    ex = ds.splits["train"][1]
    assert ex.words == ["play", "the", "beatles", "now"] and ex.tags == ["O", "B-artist", "I-artist", "O"]


def test_jointbert_token_count_mismatch_names_file_and_line(tmp_path):
    write_jointbert(tmp_path, "train", ["a b", "c d e"], ["O O", "O O"], ["x", "y"])
    with pytest.raises(DataError) as e:
        load_dataset(tmp_path)
    assert e.value.path.endswith("seq.out") and e.value.line == 2
    assert "seq.out:2:" in str(e.value)


def test_missing_split_file(tmp_path):
    write_jointbert(tmp_path, "train", ["a b"], ["O O"], ["x"])
    (tmp_path / "train" / "label").unlink()
    with pytest.raises(DataError, match="label: missing split file"):
        load_dataset(tmp_path)


def test_empty_and_unknown_files(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_dataset(empty)
    odd = tmp_path / "odd.txt"
    odd.write_text("hello world\nfoo\n")
    with pytest.raises(DataError, match="unknown format"):
        load_dataset(odd)
    with pytest.raises(DataError, match="no such file"):
        load_dataset(tmp_path / "nope.csv")
    with pytest.raises(EdgekitError, match="unknown --format"):
        load_dataset(odd, fmt="xml")


def test_csv_with_alias_columns_and_stratified_split(tmp_path):
    rows = ["utterance,category"] + [f"play song {i},music" for i in range(30)] + \
           [f"call person {i},call" for i in range(30)]
    f = tmp_path / "d.csv"
    f.write_text("\n".join(rows) + "\n")
    ds = load_dataset(f)
    assert ds.format == "csv" and not ds.has_slots and ds.slot_tags == []
    sizes = {k: len(v) for k, v in ds.splits.items()}
    assert sum(sizes.values()) == 60 and sizes["test"] == 6 and sizes["dev"] == 6
    # stratified: both intents in every split; deterministic: same split twice
    for split in ds.splits.values():
        assert {ex.intent for ex in split} == {"music", "call"}
    again = load_dataset(f)
    assert [e.text for e in again.splits["test"]] == [e.text for e in ds.splits["test"]]


def test_csv_bad_row_names_line(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text('text,label\nhello there,greet\n"only one field"\n')
    with pytest.raises(DataError, match=r"d\.csv:3:"):
        load_dataset(f)


def test_jsonl_char_spans_become_bio(tmp_path):
    f = tmp_path / "d.jsonl"
    rows = [{"text": "play  Bohemian Rhapsody by queen", "intent": "music",
             "slots": [{"start": 6, "end": 23, "slot": "song"}, {"start": 27, "end": 32, "slot": "artist"}]},
            {"text": "stop", "intent": "stop"}]
    f.write_text("\n".join(json.dumps(r) for r in rows * 10) + "\n")
    ds = load_dataset(f)
    ex = next(e for e in ds.splits["train"] + ds.splits["dev"] + ds.splits["test"] if e.intent == "music")
    assert ex.words == ["play", "Bohemian", "Rhapsody", "by", "queen"]
    assert ex.tags == ["O", "B-song", "I-song", "O", "B-artist"]
    stop = next(e for e in ds.splits["train"] if e.intent == "stop")
    assert stop.tags == ["O"]


def test_jsonl_bad_span_names_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "hi", "intent": "a"}\n{"text": "hi there", "intent": "a", '
                 '"slots": [{"start": 3, "end": 99, "slot": "x"}]}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: .*outside the text"):
        load_dataset(f)


def test_clinc_json_with_oos(tmp_path):
    d = {"train": [["what is my balance", "balance"], ["book a flight", "book_flight"]] * 5,
         "oos_train": [["sing me a song", "oos"]] * 3,
         "val": [["balance please", "balance"]], "oos_val": [["random", "oos"]],
         "test": [["my balance", "balance"]], "oos_test": [["who won", "oos"]]}
    f = tmp_path / "data_full.json"
    f.write_text(json.dumps(d))
    assert detect_format(tmp_path) == "clinc"
    ds = load_dataset(tmp_path)
    assert ds.oos_label == "oos" and "oos" in ds.intents and not ds.has_slots
    assert len(ds.splits["train"]) == 13 and len(ds.splits["test"]) == 2


def test_stratified_split_is_deterministic_and_keeps_rare_intents():
    from edgekit.data import Example

    exs = [Example([f"w{i}"], "a") for i in range(20)] + [Example(["solo"], "rare")]
    keep, held = stratified_split(exs, 0.1, seed=3)
    keep2, held2 = stratified_split(exs, 0.1, seed=3)
    assert [e.text for e in held] == [e.text for e in held2] and len(held) == 2
    assert any(e.intent == "rare" for e in keep)


def test_swap_mentions_keeps_bio_and_draws_values_of_the_same_slot():
    from edgekit.data import Example, _mentions, open_slots, swap_mentions

    train = [Example(["play", "abba"], "play", ["O", "B-artist"]),
             Example(["play", "led", "zeppelin", "now"], "play", ["O", "B-artist", "I-artist", "O"]),
             Example(["rain", "in", "paris"], "weather", ["O", "O", "B-city"]),
             Example(["hello"], "greet", ["O"])]
    values = {("abba",), ("led", "zeppelin"), ("paris",)}
    out = swap_mentions(train, 50, seed=1)
    assert len(out) == 50 and all(ex.intent != "greet" for ex in out)
    for ex in out:
        assert len(ex.words) == len(ex.tags)
        for s, e, slot in _mentions(ex.tags):
            assert tuple(ex.words[s:e]) in values and ex.tags[s] == f"B-{slot}"
    novel = swap_mentions(train, 50, seed=1, novel_words=["xyzzy"], novel_share=1.0)
    assert novel == swap_mentions(train, 50, seed=1)  # no slot is open-class with this little data
    many = [Example(["play", f"name{i}x"], "play", ["O", "B-artist"]) for i in range(40)]
    many = [Example(ex.words[:1] + ["band" + "abcdefghij"[i % 10] * (i // 10 + 1)], "play", ex.tags)
            for i, ex in enumerate(many)]
    assert open_slots(many) == {"artist"}
    assert all(ex.words[1] == "xyzzy" for ex in swap_mentions(many, 10, novel_words=["xyzzy"], novel_share=1.0))


def test_replace_words_perturbs_intent_only_examples_at_the_given_rate():
    from edgekit.data import Example, replace_words

    src = Example("book a table for two people tonight please".split(), "book")
    train = [src] + [Example(f"what is the weather in city{i} today".split(), "weather") for i in range(30)]
    out = replace_words(train, 2000, seed=2, share=0.25)
    assert out == replace_words(train, 2000, seed=2, share=0.25) and len(out) == 2000
    vocab = {w for ex in train for w in ex.words}
    assert all(ex.tags is None and set(ex.words) <= vocab for ex in out)
    books = [ex for ex in out if ex.intent == "book"]
    assert 20 < len(books) < 110 and all(len(ex.words) == len(src.words) for ex in books)
    changed = [a != b for ex in books for a, b in zip(ex.words, src.words)]
    # each word is replaced at rate 1/4; a draw gives back the same word once in |vocab| (44)
    assert 0.18 < sum(changed) / len(changed) < 0.32, sum(changed) / len(changed)
    assert all(ex.words == src.words for ex in replace_words(train, 50, share=0.0) if ex.intent == "book")
