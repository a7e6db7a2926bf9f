"""The teacher's input key covers what the build reads, by role (issue 55): the parsed splits under their roles
(train, dev, test), each data file by its path relative to the data folder with its bytes, and split folders or
files that are links, by the content they point to. Each case below gave one key for two different datasets
before: the key held the files' base names and bytes only, and Path.rglob did not enter a linked folder."""

import os
import time

import pytest

from edgekit.data.dataset import load_dataset
from edgekit.engine import BuildConfig
from edgekit.engine.cache import digest_files
from edgekit.engine.keys import data_files, splits_digest
from edgekit.errors import EdgekitError
from tests.conftest import DEMO
from tests.data.test_data import small_jointbert


def _key(data, out, base) -> str:
    from edgekit.engine.runner import prepare

    return prepare(BuildConfig(data=str(data), out=str(out), base_model=str(base))).input_digest


def test_a_test_folder_renamed_dev_is_other_data(tmp_path, tiny_bert):
    """JointBERT train/ and test/, then test/ renamed dev/: the same files under the same base names, but dev is
    now given and test drawn from train (another train split)."""
    data = small_jointbert(tmp_path / "data", with_dev_test=False)
    small_jointbert(tmp_path / "given")  # its dev/ and test/ folders
    os.rename(tmp_path / "given" / "test", data / "test")
    before = _key(data, tmp_path / "out", tiny_bert)
    os.rename(data / "test", data / "dev")
    assert _key(data, tmp_path / "out", tiny_bert) != before


def test_the_same_file_under_another_relative_path_is_another_key(tmp_path, tiny_bert):
    keys = []
    for sub in ("notes", "other"):
        data = tmp_path / sub / "data"
        (data / sub).mkdir(parents=True)
        (data / "train.jsonl").write_text(DEMO.read_text())
        (data / sub / "extra.txt").write_text("the same bytes\n")
        keys.append(_key(data, tmp_path / "out", tiny_bert))
    assert keys[0] != keys[1]


def test_a_linked_split_folder_is_keyed_by_its_content(tmp_path, tiny_bert):
    store = small_jointbert(tmp_path / "store")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev", "test"):
        (data / split).symlink_to(store / split, target_is_directory=True)
    assert [p.relative_to(data).as_posix() for p in data_files(str(data), str(tmp_path / "out"))][:3] == \
        ["dev/label", "dev/seq.in", "dev/seq.out"]
    before = _key(data, tmp_path / "out", tiny_bert)
    label = store / "train" / "label"
    label.write_text(label.read_text().replace("Play", "Weather", 1))  # one train utterance relabelled
    assert _key(data, tmp_path / "out", tiny_bert) != before


def test_a_linked_split_file_is_keyed_by_its_content(tmp_path):
    store, data = tmp_path / "store", tmp_path / "data"
    store.mkdir()
    data.mkdir()
    (store / "train.jsonl").write_text(DEMO.read_text())
    (data / "train.jsonl").symlink_to(store / "train.jsonl")

    def key():
        return digest_files(data_files(str(data), str(tmp_path / "out")), data)

    before = key()
    (store / "train.jsonl").write_text(DEMO.read_text().replace("set_alarm", "create_reminder", 1))
    assert key() != before


def test_a_split_column_assigned_otherwise_is_other_data(tmp_path, tiny_bert):
    """One CSV file holding every split: the same rows with two of them moved between train and test give another
    digest of the parsed splits, and so another key."""
    rows = [("play some jazz", "play"), ("play the beatles", "play"), ("play queen now", "play"),
            ("play abba", "play"), ("rain in paris", "weather"), ("weather in oslo", "weather"),
            ("is it cold in rome", "weather"), ("sunny in nice", "weather")]
    splits = ["train", "train", "dev", "test", "train", "train", "dev", "test"]
    keys, digests = [], []
    for case, order in (("a", splits), ("b", splits[:3] + ["train", "test"] + splits[5:])):
        data = tmp_path / case / "data.csv"
        data.parent.mkdir()
        data.write_text("text,label,split\n" + "".join(f"{t},{lab},{s}\n" for (t, lab), s in zip(rows, order)))
        digests.append(splits_digest(load_dataset(data)))
        keys.append(_key(data, tmp_path / "out", tiny_bert))
    assert digests[0] != digests[1] and keys[0] != keys[1]


def test_the_splits_digest_follows_roles_not_only_examples():
    """The same utterances, one split's role swapped with another's: another digest."""
    ds = load_dataset(DEMO)
    before = splits_digest(ds)
    ds.splits["dev"], ds.splits["test"] = ds.splits["test"], ds.splits["dev"]
    assert splits_digest(ds) != before


def test_a_link_loop_in_the_data_folder_is_refused_in_one_line_at_once(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(DEMO.read_text())
    (data / "again").symlink_to(data, target_is_directory=True)
    t0 = time.perf_counter()
    with pytest.raises(EdgekitError, match="a folder that holds it") as e:
        data_files(str(data), str(tmp_path / "out"))
    assert time.perf_counter() - t0 < 5 and "\n" not in str(e.value) and str(data / "again") in str(e.value)


def test_an_out_folder_reached_through_a_link_in_the_data_folder_is_not_data(tmp_path):
    """Links are followed now: OUT named through a link inside the data folder stays out of the key."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (data / "train").mkdir(parents=True)
    elsewhere.mkdir()
    (data / "train" / "seq.in").write_text("a b\n")
    (elsewhere / "report.json").write_text("{}")
    (data / "build").symlink_to(elsewhere, target_is_directory=True)
    assert data_files(str(data), str(data / "build")) == [data / "train" / "seq.in"]
