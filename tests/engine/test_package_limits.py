"""Refuse early (issue 55): every limit the runtime holds a package to that the data decides is checked by
`prepare`, before any training, in one line naming the data and the limit. Before, data whose labels.json was over
the runtime's 4 MiB reached the teacher stage and was refused after training, by the package stage's own load."""

import json
import shutil

import pytest

from edgekit.engine import BuildConfig
from edgekit.engine.runner import package_limits, prepare
from edgekit.errors import EdgekitError
from edgekit.runtime import jsonfile, protofile
from edgekit.runtime.package import SCHEMA_PATH
from tests.conftest import DEMO

BASIC = ["teacher", "export", "package"]  # no trim_vocab: the base model's pieces are the package's


def _split_files(folder, train: list[tuple[str, str]]):
    """A folder of split files: `train` (text, intent) rows, and one dev and one test row of its first intent."""
    folder.mkdir(parents=True)
    for name, rows in (("train", train), ("dev", train[:1]), ("test", train[:1])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t, "intent": i}) + "\n" for t, i in rows))
    return folder


def _refused(data, tmp_path, base, *needles, **cfg):
    out = tmp_path / "out"
    with pytest.raises(EdgekitError) as e:
        prepare(BuildConfig(data=str(data), out=str(out), base_model=str(base), **cfg))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(data)), msg
    for n in needles:
        assert n in msg, msg
    assert not out.exists()  # refused before OUT is made, and so before any stage
    return msg


def test_the_limits_are_read_from_the_runtime():
    schema = json.loads(SCHEMA_PATH.read_text())["properties"]
    lim = package_limits()
    assert lim["labels_bytes"] == jsonfile.LABELS_BYTES and lim["manifest_bytes"] == jsonfile.MANIFEST_BYTES
    assert lim["max_len"] == (schema["max_len"]["minimum"], schema["max_len"]["maximum"])
    assert lim["intents"][0] == schema["label_sets"]["properties"]["intents"]["minimum"]
    assert lim["pieces"][1] < protofile.MAX_FIELDS


def test_labels_over_4_mib_are_refused_before_training(tmp_path, tiny_bert):
    names = [f"{k}" + "x" * 900_000 for k in range(5)]  # 4.5 MB of intent names, each line under 1 MiB
    data = _split_files(tmp_path / "data", [("play some jazz", n) for n in names])
    _refused(data, tmp_path, tiny_bert, "labels.json would be", "4 MiB", "5 intents")


def test_a_manifest_over_1_mib_is_refused_before_training(tmp_path, tiny_bert):
    """An out-of-scope class: the manifest may list every other intent (decoding.allowed_intents). 1.2 MB of names
    is within labels.json's 4 MiB and over the manifest's 1 MiB."""
    names = ["oos"] + [f"{k}" + "x" * 400_000 for k in range(3)]
    data = _split_files(tmp_path / "data", [("play some jazz", n) for n in names])
    _refused(data, tmp_path, tiny_bert, "manifest.json would be", "1 MiB")


def test_a_sequence_length_over_the_schemas_is_refused(tmp_path, tiny_bert):
    """A base model with 1024 positions and utterances of 600 words: max_len 608, over the manifest's 512."""
    base = tmp_path / "long_bert"
    shutil.copytree(tiny_bert, base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    data = _split_files(tmp_path / "data", [(" ".join(["play"] * 600), "a"), (" ".join(["rain"] * 600), "b")])
    _refused(data, tmp_path, base, "608 pieces of sequence length", "more than the 512", "max_len")


@pytest.mark.parametrize("name, most, needle", [("intents", 3, "label_sets.intents"),
                                                ("slot_tags", 5, "label_sets.slot_tags")])
def test_label_counts_over_the_schemas_are_refused(tmp_path, tiny_bert, monkeypatch, name, most, needle):
    """The schema's bounds are 2**53 - 1, past what labels.json's 4 MiB holds: lowered here to show the check."""
    lim = package_limits()
    monkeypatch.setattr("edgekit.engine.runner.package_limits", lambda: {**lim, name: (lim[name][0], most)})
    _refused(DEMO, tmp_path, tiny_bert, needle, f"more than the {most}")


def test_a_vocabulary_over_what_a_tokenizer_model_may_hold_is_refused(tmp_path, tiny_bert, monkeypatch):
    """The runtime walks at most protofile.MAX_FIELDS fields of tokenizer.model (one a piece): lowered to 100."""
    monkeypatch.setattr(protofile, "MAX_FIELDS", 100)
    _refused(DEMO, tmp_path, tiny_bert, "pieces in the base model's vocabulary", "tokenizer.vocab_size",
             stages=BASIC)


def test_the_cli_refuses_over_limit_data_with_exit_2_and_one_line(tmp_path, tiny_bert):
    from tests.cli.test_cli import assert_one_line_error, run

    names = [f"{k}" + "x" * 900_000 for k in range(5)]
    data = _split_files(tmp_path / "data", [("play some jazz", n) for n in names])
    assert_one_line_error(run("build", "--data", str(data), "--out", str(tmp_path / "out"), "--base-model",
                              str(tiny_bert)), "labels.json would be", str(data))
    assert not (tmp_path / "out").exists()
