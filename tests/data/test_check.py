"""Provenance (every reader keeps each utterance's file and line) and the data check (edgekit.data.check): one small
JointBERT dataset per kind of finding, each finding's file, line and count known."""

import json

import pytest

from edgekit.data.check import KINDS, CheckConfig, Lengths, check_dataset, spans, summary
from edgekit.data.dataset import Example, load_dataset, read_utterances
from edgekit.data.formats import read_clinc, read_csv, read_jsonl
from tests.data.test_data import write_jointbert

# --- provenance -----------------------------------------------------------------------------------------------------


def test_jointbert_examples_keep_their_seq_in_line(tmp_path):
    write_jointbert(tmp_path, "train", ["a b", "c d", "e"], ["O O", "O O", "O"], ["x", "y", "x"])
    ds = load_dataset(tmp_path)  # dev and test drawn from train: they keep where they were read
    got = sorted((ex.text, ex.line) for exs in ds.splits.values() for ex in exs)
    assert got == [("a b", 1), ("c d", 2), ("e", 3)]
    assert {ex.file for exs in ds.splits.values() for ex in exs} == {str(tmp_path / "train" / "seq.in")}


def test_csv_rows_keep_their_first_line(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text('text,label\n\nhello there,greet\n"two\nlines",x\n  \nbye,y\n')
    exs = read_csv(f)["train"]
    assert [(ex.text, ex.line) for ex in exs] == [("hello there", 3), ("two lines", 4), ("bye", 7)]
    assert {ex.file for ex in exs} == {str(f)}


def test_jsonl_lines_and_split_files(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "a b", "intent": "x"}\n\n{"text": "c", "intent": "y", "split": "test"}\n')
    got = read_jsonl(f)
    assert [(ex.text, ex.line) for ex in got["train"]] == [("a b", 1)] and got["test"][0].line == 3
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "a b", "intent": "x"}\n')
    (folder / "test.csv").write_text("text,label\nc d,y\n")
    ds = load_dataset(folder, "split-files")
    assert ds.splits["test"][0].file == str(folder / "test.csv") and ds.splits["test"][0].line == 2


def test_clinc_rows_are_numbered_within_their_list(tmp_path):
    f = tmp_path / "data_full.json"
    f.write_text(json.dumps({"train": [["a b", "x"], ["c", "y"]], "oos_train": [["d", "oos"]], "val": [["e", "x"]]}))
    got = read_clinc(f)
    assert [(ex.text, ex.line) for ex in got["train"]] == [("a b", 1), ("c", 2), ("d", 1)]
    assert got["dev"][0].line == 1 and got["dev"][0].file == str(f)


def test_provenance_is_not_part_of_equality_nor_of_repr(tmp_path):
    read = Example(["a"], "x", None, "f.csv", 7)
    assert read == Example(["a"], "x") and "f.csv" not in repr(read)
    f = tmp_path / "u.txt"
    f.write_text("one\n\ntwo words\n")
    assert [(ex.text, ex.line) for ex in read_utterances(f)] == [("one", 1), ("two words", 3)]


# --- the checks -----------------------------------------------------------------------------------------------------

# Rows "words|tags|intent"; every split ends with these, which alone give no finding.
BASE = {"train": ["what time is it|O O O O|Time", "time please|O O|Time"], "dev": ["what time now|O O O|Time"],
        "test": ["the time please|O O O|Time"]}
ONE = CheckConfig(min_intent_examples=1, min_slot_values=1)


def dataset(tmp_path, **rows):
    for split in ("train", "dev", "test"):
        parts = [r.split("|") for r in rows.get(split, []) + BASE[split]]
        write_jointbert(tmp_path, split, [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts])
    return load_dataset(tmp_path)


def found(ds, cfg=ONE, lengths=None) -> list[tuple]:
    return [(f.kind, f.file.split("/", f.file.count("/") - 1)[-1], f.line, f.count)
            for f in check_dataset(ds, cfg, lengths)]


CASES = {
    "clean": ({}, []),
    "duplicate": ({"train": ["play queen|O B-artist|Play", "play abba|O B-artist|Play", "play queen|O B-artist|Play"]},
                  [("duplicate", "train/seq.in", 3, 2)]),
    "near duplicate: case and accents": ({"train": ["play queen|O B-artist|Play", "Play  Quéen|O B-artist|Play"]},
                                         [("near_duplicate", "train/seq.in", 2, 2)]),
    "near duplicate: punctuation spacing": ({"train": ["what's up|O O|Chat", "what 's up|O O O|Chat"]},
                                            [("near_duplicate", "train/seq.in", 2, 2)]),
    "leakage": ({"train": ["play queen|O B-artist|Play"], "test": ["Play Queen|O B-artist|Play"]},
                [("leakage", "test/seq.in", 1, 1)]),
    "intent conflict": ({"train": ["play queen|O B-artist|Play", "play queen|O B-artist|Search"]},
                        [("duplicate", "train/seq.in", 2, 2), ("intent_conflict", "train/seq.in", 2, 2)]),
    "tag conflict": ({"train": ["play queen|O B-artist|Play", "play queen|O B-album|Play"]},
                     [("duplicate", "train/seq.in", 2, 2), ("tag_conflict", "train/seq.in", 2, 2)]),
    "similar intents": ({"train": ["play queen|O B-artist|PlayMusic", "play abba|O B-artist|play_music"]},
                        [("similar_labels", "train/seq.in", 2, 2)]),
    "similar slot names": ({"train": ["play queen|O B-artist|Play", "play abba|O B-Artist|Play"]},
                           [("similar_labels", "train/seq.in", 2, 2)]),
    "unseen labels": ({"train": ["play queen|O B-artist|Play"], "dev": ["rain in oslo|O O B-city|Time"],
                       "test": ["book a table|O O O|Book", "book it|O O|Book"]},
                      [("unseen_label", "test/seq.in", 1, 2), ("unseen_label", "dev/seq.in", 1, 1)]),
    "invalid BIO": ({"train": ["fly to new york|O O I-city I-city|Fly", "fly to oslo now|O B-city I-date I-city|Fly",
                               "fly to los angeles|O O B-city I-city|Fly"]},
                    [("invalid_bio", "train/seq.in", 1, 1), ("invalid_bio", "train/seq.in", 2, 2)]),
}


@pytest.mark.parametrize("case", CASES)
def test_each_kind_is_found_where_it_is(tmp_path, case):
    rows, want = CASES[case]
    assert found(dataset(tmp_path, **rows)) == want


def test_thresholds_are_settings(tmp_path):
    ds = dataset(tmp_path, train=["play queen|O B-artist|Play", "queen please|B-artist O|Play",
                                  "play abba now|O B-artist O|Play"])
    assert found(ds, CheckConfig(min_intent_examples=3, min_slot_values=2)) == [("rare_intent", "train/seq.in", 4, 2)]
    assert found(ds, CheckConfig(min_intent_examples=1, min_slot_values=3)) == \
        [("few_slot_values", "train/seq.in", 1, 2)]  # artist: queen, abba
    with pytest.raises(ValueError, match="min_slot_values"):
        CheckConfig(min_slot_values=-1)


def test_truncation_against_the_build_length(tmp_path):
    ds = dataset(tmp_path, train=["please play the song queen now|O O O O B-artist O|Play"])
    words = Lengths(max_len=6, count=lambda text: len(text.split()) + 2)  # "what time is it": 6, not over
    assert found(ds, lengths=words) == [("truncated", "train/seq.in", 1, 2)]
    assert found(ds) == []  # no lengths: not checked


def test_spans_read_bio_as_conlleval():
    assert spans(["O", "I-city", "I-city", "B-date", "I-time"]) == ([("city", 1, 3), ("date", 3, 4), ("time", 4, 5)],
                                                                    [1, 4])


def test_summary_counts_per_kind_and_keeps_the_first(tmp_path):
    ds = dataset(tmp_path, train=["a b|O O|Time", "a b|O O|Time", "c d|O O|Time", "c d|O O|Time", "e|O|Time"])
    s = summary(check_dataset(ds, ONE), shown=1)
    assert s["total"] == 2 and s["counts"] == {"duplicate": 2}
    (first,) = s["findings"]
    assert first["where"] == f"{tmp_path / 'train' / 'seq.in'}:2" and first["severity"] == "warn"
    assert set(KINDS) >= set(s["counts"])
