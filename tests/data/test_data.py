import json

import pytest

from edgekit.data.dataset import build_seed, detect_format, load_dataset, stratified_split
from edgekit.errors import DataError, EdgekitError
from tests.cli.test_cli import assert_one_line_error, run
from tests.conftest import DEMO


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


@pytest.mark.parametrize("name, text, fmt, message", [
    ("d.csv", 'text,label\nhello there,greet\n"only one field"\n', None, r"d\.csv:3:"),  # a bad row: its line
    # a lone surrogate escape in JSON data: its line (it crashed the build's length count)
    ("d.jsonl", '{"text": "stop it", "intent": "b"}\n{"text": "play \\ud800 now", "intent": "a"}\n', None,
     r"d\.jsonl:2: a lone surrogate \(\\ud800\)"),
    ("d.csv", "text,label\nhello there,greet\n", "split-files", "reads a folder"),  # that format on a file
])
def test_bad_data_is_one_clear_error(tmp_path, name, text, fmt, message):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(DataError, match=message):
        load_dataset(f, fmt)


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
    from edgekit.data.dataset import Example

    exs = [Example([f"w{i}"], "a") for i in range(20)] + [Example(["solo"], "rare")]
    keep, held = stratified_split(exs, 0.1, seed=3)
    keep2, held2 = stratified_split(exs, 0.1, seed=3)
    assert [e.text for e in held] == [e.text for e in held2] and len(held) == 2
    assert any(e.intent == "rare" for e in keep)


def test_swap_mentions_keeps_bio_and_draws_values_of_the_same_slot():
    from edgekit.data.augment import _mentions, open_slots, swap_mentions
    from edgekit.data.dataset import Example

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
    from edgekit.data.augment import replace_words
    from edgekit.data.dataset import Example

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


# Issue 19, strict and friendly parsing: each test below is a case a user met.

def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _two_intents(n=10):
    return [{"text": f"play song {i}", "intent": "music"} for i in range(n)] + \
           [{"text": f"call person {i}", "intent": "call"} for i in range(n)]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "jointbert", "clinc"])
def test_utf8_bom_is_accepted_and_stripped(tmp_path, fmt):
    """Excel and Notepad write a byte order mark; it must not become part of the first column name or word."""
    bom = b"\xef\xbb\xbf"
    rows = _two_intents()
    if fmt == "jsonl":
        data = tmp_path / "d.jsonl"
        data.write_bytes(bom + "".join(json.dumps(r) + "\n" for r in rows).encode())
    elif fmt == "csv":
        data = tmp_path / "d.csv"
        data.write_bytes(bom + b"text,label\r\n" + "".join(f"{r['text']},{r['intent']}\r\n" for r in rows).encode())
    elif fmt == "jointbert":
        data = small_jointbert(tmp_path)
        for name in ("seq.in", "seq.out", "label"):
            f = data / "train" / name
            f.write_bytes(bom + f.read_bytes())
    else:
        data = tmp_path / "data_full.json"
        data.write_bytes(bom + json.dumps({"train": [[r["text"], r["intent"]] for r in rows]}).encode())
    ds = load_dataset(data)
    assert ds.format == fmt
    words = {w for split in ds.splits.values() for ex in split for w in ex.words}
    assert not any("\ufeff" in w for w in words) and not any("\ufeff" in i for i in ds.intents)
    assert "play" in words or "rain" in words


def test_csv_duplicate_header_column_is_refused_naming_it_on_line_1(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("text,label,Label\nhello there,greet,bye\n")
    with pytest.raises(DataError, match=r"d\.csv:1: duplicate column label") as e:
        load_dataset(f)
    assert e.value.line == 1
    f.write_text("text,utterance,label\nhello there,hi,greet\n")  # two text columns: which one is meant?
    with pytest.raises(DataError, match=r"d\.csv:1: 2 text columns \(text, utterance\)"):
        load_dataset(f)


@pytest.mark.parametrize("name", [3, "", "  ", None])
def test_slot_name_that_is_not_a_non_empty_string_is_refused_with_file_and_line(tmp_path, name):
    rows = _two_intents(2) + [{"text": "play queen", "intent": "music",
                               "slots": [{"start": 5, "end": 10, "slot": name}]}]
    f = _jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match=r"d\.jsonl:5: slot name .*must be a non-empty string"):
        load_dataset(f)
    if name == 3:  # was a TypeError traceback with exit code 1 (eval reads data through the same load_dataset)
        assert_one_line_error(run("build", "--data", str(f), "--out", str(tmp_path / "o")), "d.jsonl:5:",
                              "slot name 3")


def test_span_that_cuts_a_word_is_refused_showing_the_word_and_the_span(tmp_path):
    rows = [{"text": "play queen now", "intent": "music", "slots": [{"start": 6, "end": 10, "slot": "artist"}]}]
    with pytest.raises(DataError) as e:
        load_dataset(_jsonl(tmp_path / "d.jsonl", rows))
    msg = str(e.value)
    assert "d.jsonl:1:" in msg and "[6, 10) 'ueen' starts inside the word 'queen'" in msg and "[5, 10)" in msg
    rows[0]["slots"] = [{"start": 0, "end": 7, "slot": "x"}]  # ends inside "queen"
    with pytest.raises(DataError, match="'play qu' ends inside the word 'queen'.*e.g. \\[0, 10\\) 'play queen'"):
        load_dataset(_jsonl(tmp_path / "d.jsonl", rows))


def test_span_that_leaves_out_punctuation_tags_the_whole_word_and_says_so(tmp_path):
    """'queen' in 'queen,': whitespace words cannot split there; the label keeps its meaning, and a note says so."""
    rows = [{"text": "play queen, now", "intent": "music", "slots": [{"start": 5, "end": 10, "slot": "artist"}]},
            {"text": "play (abba)", "intent": "music", "slots": [{"start": 6, "end": 10, "slot": "artist"}]}]
    ds = load_dataset(_jsonl(tmp_path / "d.jsonl", rows * 2 + _two_intents()))
    tagged = {tuple(ex.words): ex.tags for split in ds.splits.values() for ex in split}
    assert tagged[("play", "queen,", "now")] == ["O", "B-artist", "O"]
    assert tagged[("play", "(abba)")] == ["O", "B-artist"]
    assert any("4 slot span" in n and "'queen' in 'queen,'" in n for n in ds.notes)


def test_data_too_small_to_train_is_refused_before_training_naming_the_minimum(tmp_path):
    from edgekit.data.dataset import check_trainable

    one = _jsonl(tmp_path / "one.jsonl", [{"text": "hello", "intent": "greet"}])
    res = run("build", "--data", str(one), "--out", str(tmp_path / "o"))  # was: fails after the first epoch
    assert_one_line_error(res, "one.jsonl: cannot train", "1 intent in train ('greet')", "at least 2",
                          "give one intent at least 4 examples")
    # a label seen once in a small set: kept in train by the split (as ATIS's one-off intents), but nothing is
    # left for dev: the message says what to add
    rare = load_dataset(_jsonl(tmp_path / "rare.jsonl", [{"text": f"w {i}", "intent": "a"} for i in range(3)]
                               + [{"text": "solo", "intent": "rare"}]))
    with pytest.raises(DataError, match="dev would be empty.*at least 4 examples, or give dev split$"):
        check_trainable(rare)
    # the minimum: 2 intents, one of them with 4 examples (a build on it runs through; checked by hand)
    check_trainable(load_dataset(_jsonl(tmp_path / "min.jsonl", [{"text": f"w {i}", "intent": "a"} for i in range(4)]
                                        + [{"text": "solo", "intent": "rare"}])))
    # with a test split given, dev needs 3 of one intent; with both given, any sizes do
    rows = [{"text": f"w {i}", "intent": "a"} for i in range(2)] + [{"text": "solo", "intent": "b"},
                                                                     {"text": "t", "intent": "a", "split": "test"}]
    with pytest.raises(DataError, match="dev would be empty.*at least 3 examples"):
        check_trainable(load_dataset(_jsonl(tmp_path / "t.jsonl", rows)))
    check_trainable(load_dataset(_jsonl(tmp_path / "t.jsonl", rows + [{"text": "d", "intent": "b", "split": "dev"}])))


def test_out_that_cannot_be_written_is_refused_before_training(tmp_path, tiny_bert):
    """The tests run as root, where chmod does not stop writes: the cases below fail for root too."""
    import tempfile

    from edgekit.engine import BuildConfig
    from edgekit.engine.runner import prepare

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    # a new OUT whose parent is a regular file (was an OSError traceback after training)
    res = run("build", "--data", str(DEMO), "--out", str(blocker / "o"), "--base-model", str(tiny_bert))
    assert_one_line_error(res, f"--out {blocker / 'o'}: cannot write there")
    # an OUT that exists and takes no files: /sys refuses new files, root included
    try:
        tempfile.NamedTemporaryFile(dir="/sys").close()
        pytest.skip("/sys accepts new files on this machine, so it cannot stand for an OUT that refuses them")
    except OSError:
        pass
    with pytest.raises(EdgekitError, match="--out /sys: cannot write there"):
        prepare(BuildConfig(data=str(DEMO), out="/sys", base_model=str(tiny_bert)))


def test_folder_of_split_files_is_read_as_banking77_comes(tmp_path):
    d = tmp_path / "banking77"
    d.mkdir()
    (d / "train.csv").write_text("text,category\n" + "".join(f"card {i} lost,lost_card\nrate {i},rates\n"
                                                             for i in range(20)))
    (d / "test.csv").write_text("text,category\ncard gone,lost_card\nwhat rate,rates\n")
    assert detect_format(d) == "split-files"
    ds = load_dataset(d)
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 36, "dev": 4, "test": 2}
    assert ds.split_from_train == ["dev"] and ds.intents == ["lost_card", "rates"]
    _jsonl(d / "validation.jsonl", [{"text": "new card", "intent": "lost_card"}])  # .jsonl beside .csv is fine
    assert len(load_dataset(d).splits["dev"]) == 1
    _jsonl(d / "validation.jsonl", [{"text": "new card", "intent": "lost_card", "split": "test"}])
    with pytest.raises(DataError, match=r"validation\.jsonl:1: split 'test' in the dev file"):
        load_dataset(d)
    (d / "dev.csv").write_text("text,label\nx,rates\n")
    with pytest.raises(DataError, match=r"2 files for the dev split \(dev\.csv, validation\.jsonl\)"):
        load_dataset(d)
    (d / "dev.csv").unlink()
    (d / "validation.jsonl").unlink()
    (d / "test.csv").unlink()  # no test: split from train, as for a single file
    assert load_dataset(d).split_from_train == ["test", "dev"]
    (d / "train.csv").rename(d / "other.csv")
    (d / "test.csv").write_text("text,category\ncard gone,lost_card\n")
    with pytest.raises(DataError, match="no train file .*found test.csv"):
        load_dataset(d)


def test_latin1_bytes_in_a_utf8_file_name_the_line_and_the_byte(tmp_path):
    f = tmp_path / "d.csv"
    f.write_bytes("text,label\r\ncafé au lait,order\r\n".encode() + b"caf\xe9 noir,order\r\n")
    with pytest.raises(DataError, match=r"d\.csv:3: not valid UTF-8 \(byte 0xe9\); save the file as UTF-8"):
        load_dataset(f)


def test_jsonl_text_holding_a_unicode_line_separator_stays_one_row(tmp_path):
    """json.dumps(ensure_ascii=False) writes U+2028 raw; str.splitlines would cut the row there."""
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in
                         [{"text": "play\u2028queen", "intent": "music"}] + _two_intents()), encoding="utf-8")
    ds = load_dataset(f)
    assert sum(len(s) for s in ds.splits.values()) == 21


def test_scoring_a_package_holds_out_what_its_build_held_out(tmp_path):
    # data without a test split: the build drew one with its seed; eval, bench, profile and compare read that seed
    # from the package's report.json, or they would score on utterances the model trained on
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    assert build_seed(pkg) is None  # no report: unknown (load_dataset warns and draws with 0)
    (pkg / "report.json").write_text(json.dumps({"config": {"seed": 3}}))
    assert build_seed(pkg) == 3
    built = {ex.text for ex in load_dataset(DEMO, seed=3).splits["test"]}
    assert {ex.text for ex in load_dataset(DEMO, seed=build_seed(pkg)).splits["test"]} == built
    assert {ex.text for ex in load_dataset(DEMO).splits["test"]} != built  # seed 0 holds out others
    (pkg / "report.json").write_text("{not json")
    assert build_seed(pkg) is None
    assert {ex.text for ex in load_dataset(DEMO, seed=None).splits["test"]} == {
        ex.text for ex in load_dataset(DEMO).splits["test"]}


def test_unlabelled_utterances_are_read_one_a_line(tmp_path):
    from edgekit.data.dataset import read_utterances

    f = tmp_path / "logs.txt"
    f.write_bytes(b"\xef\xbb\xbfplay  some jazz\r\n\n   \nwhat is the weather\nbook a table\n")
    got = read_utterances(f)
    assert [ex.words for ex in got] == [["play", "some", "jazz"], ["what", "is", "the", "weather"], ["book", "a", "table"]]
    assert all(ex.intent is None and ex.tags is None for ex in got)
    assert len(read_utterances(f, limit=2)) == 2
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(DataError, match="holds no utterance"):
        read_utterances(tmp_path / "blank.txt")
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad.txt:2: not valid UTF-8"):
        read_utterances(tmp_path / "bad.txt")
