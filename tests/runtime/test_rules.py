"""docs/package-format.md's rules R1-R14 in the Python runtime, one test (or a few) per rule, on the hand-made
package of test_package.py (no model loaded) and, where a model must answer, a copy of the schema-2 fixture.
The same rules in examples/web/client.mjs: examples/web/client.test.mjs."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgekit.runtime import Package, Predictor
from edgekit.runtime.decode import intent_name
from edgekit.runtime.package import SCHEMA_PATHS, PackageError, schema

from .test_package import OUTPUTS, SPECIAL, onnx_graph, spm_model, verify, write_package
from .test_package_json import edit_manifest, resign

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "schema2"


def refused(root, words: str) -> None:
    with pytest.raises(PackageError) as e:
        Package.load(root)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    out = verify(root)
    assert out.returncode == 2 and out.stderr.startswith("error:") and "Traceback" not in out.stderr, out.stderr


def test_r1_each_schema_version_has_its_own_schema_and_id_and_the_packages_copy_has_no_say(tmp_path):
    ids = {v: schema(p)["$id"] for v, p in SCHEMA_PATHS.items()}
    assert ids == {v: f"https://edgekit.dev/schemas/manifest/{v}.json" for v in (2, 3, 4)}
    assert Package.load(write_package(tmp_path / "two", version=2)).mask_dtype == "bool"
    three = Package.load(write_package(tmp_path / "three", version=3)).manifest  # no path_confidence, no score
    assert three["outputs"] == ["intent", "confidence", "tags"] and "score" not in three["cascade"]
    root = write_package(tmp_path / "four")
    assert Package.load(root).mask_dtype == "int32"
    edit_manifest(root, lambda m: m["inputs"][3].update(dtype="bool"))  # schema 2's mask type under version 4
    refused(root, "inputs.3.dtype: 'int32' was expected")
    edit_manifest(root, lambda m: m["inputs"][3].update(dtype="int32"))
    (root / "manifest.schema.json").write_text("{}")  # a package cannot loosen its own rules
    resign(root)
    edit_manifest(root, lambda m: m.update(surprise=1))
    refused(root, "Additional properties are not allowed ('surprise' was unexpected)")


@pytest.mark.parametrize("version,words", [(1, "schema_version 1, this runtime reads 2, 3 and 4 (rebuild the package"),
                                           (5, "schema_version 5, this runtime reads 2, 3 and 4"),
                                           ("3", "schema_version '3', this runtime reads 2, 3 and 4"),
                                           (None, "schema_version None, this runtime reads 2, 3 and 4")])
def test_r2_other_schema_versions_are_refused_in_one_line(tmp_path, version, words):
    root = write_package(tmp_path / "p", schema_version=version)
    if version is None:
        edit_manifest(root, lambda m: m.pop("schema_version"))
    refused(root, words)


@pytest.mark.parametrize("written", ["16.0", "1.6e1"])
def test_r3_an_integer_field_is_its_value_however_written(tmp_path, written):
    root = write_package(tmp_path / "p")
    raw = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(raw.replace('"max_len": 16,', f'"max_len": {written},')
                                        .replace('"oos_id": 2,', '"oos_id": 2.0,'))
    pkg = Package.load(root)
    assert pkg.max_len == 16 and type(pkg.manifest["max_len"]) is int and type(pkg.manifest["decoding"]["oos_id"]) is int
    assert pkg.manifest["decoding"]["threshold"] == 0.5 and pkg.manifest["cascade"]["timeout_s"] == 0.3
    assert type(pkg.manifest["decoding"]["temperature"]) is float  # a number field stays a double, 1.0 included


@pytest.mark.parametrize("version,ok", [(2, True), (3, False)])
def test_r3_integer_fields_stop_at_2_to_the_53_in_schema_3(tmp_path, version, ok):
    root = write_package(tmp_path / "p", version=version)
    edit_manifest(root, lambda m: m["files"]["labels.json"].update(bytes=2 ** 53))
    # schema 2 lets the number through to the files' limit (from the manifest alone); schema 3 refuses it as a number
    refused(root, "files.labels.json.bytes: 9007199254740992, more than the" if ok else
            "9007199254740992 is greater than the maximum")


@pytest.mark.parametrize("tags,words", [
    (["B-x"], "slot_tags.0: 'O' was expected"),
    (["B-x", "O"], "slot_tags.1: 'O' is not a tag B-x or I-x"),
    (["O", "X-y"], "slot_tags.1: 'X-y' is not a tag B-x or I-x"),
    (["O", "B-"], "slot_tags.1: 'B-' is not a tag B-x or I-x"),
    (["O", "B-x", "B-x"], "slot_tags: 'B-x' is given twice"),
    (["O", "O"], "slot_tags: 'O' is given twice"),
])
def test_r4_slot_tags_are_o_then_b_and_i_tags_each_once(tmp_path, tags, words):
    root = write_package(tmp_path / "p", labels={"intents": ["a", "b"], "slot_tags": tags, "oos_label": None},
                         label_sets={"intents": 2, "slot_tags": len(tags)})
    refused(root, words)


@pytest.mark.parametrize("tags", [[], ["O", "B-x", "I-x"]])
def test_r4_good_slot_tags_load(tmp_path, tags):
    root = write_package(tmp_path / "p", labels={"intents": ["a", "b"], "slot_tags": tags},
                         label_sets={"intents": 2, "slot_tags": len(tags)},
                         **({} if tags else {"outputs": ["intent", "confidence"],
                                             "cascade": {"threshold": None, "timeout_s": 0.3, "score": "confidence"}}))
    if not tags:
        (root / "model.onnx").write_bytes(onnx_graph(json.loads((root / "manifest.json").read_text())["inputs"],
                                                     OUTPUTS[:2]))
        resign(root)
    assert Package.load(root).labels["slot_tags"] == tags


@pytest.mark.parametrize("model,words", [
    (spm_model(8, normalizer="nmt_nfkc"), "its normalizer is 'nmt_nfkc', the manifest's tokenizer.normalizer says"),
    (spm_model(8, normalizer=None), "its normalizer is '', the manifest's"),
    (spm_model(8, special=SPECIAL + [("[CLS]", 3)]), "piece '[CLS]' is [(2, 'CONTROL'), (4, 'CONTROL')] (id, type)"),
    (spm_model(8, special=[("<pad>", 1)] + SPECIAL[1:]), "piece '<pad>' is [(0, 'NORMAL')] (id, type), the manifest"),
    (spm_model(8, special=[SPECIAL[0], SPECIAL[2], SPECIAL[1], SPECIAL[3]]),
     "piece '<unk>' is [(2, 'UNKNOWN')] (id, type), the manifest's tokenizer.special_ids.unk says one UNKNOWN piece at "
     "id 1"),
    (spm_model(8, special=SPECIAL[:3]), "piece '[SEP]' is [] (id, type)"),
])
def test_r5_special_pieces_and_the_normalizer_are_read_from_the_protobuf(tmp_path, model, words):
    refused(write_package(tmp_path / "p", tokenizer=model), words)


def test_r5_the_last_normalizer_spec_wins(tmp_path):
    from tests.runtime.test_package import proto

    # a second NormalizerSpec (field 3) appended: protobuf merges them, its name (field 1) the last one
    model = spm_model(8, normalizer="nmt_nfkc") + proto((3, proto((1, "edgekit_bert_basic"))))
    assert Package.load(write_package(tmp_path / "p", tokenizer=model)).manifest["tokenizer"]["vocab_size"] == 8


@pytest.mark.parametrize("outputs,words", [
    ([dict(OUTPUTS[0]), dict(OUTPUTS[1], dtype="int64"), *OUTPUTS[2:]],
     "the graph's outputs are [('intent', 'int64 [1]'"),
    (OUTPUTS[:3], "the manifest's outputs say ['intent', 'confidence', 'tags', 'path_confidence'] (intent int64, "),
    ([*OUTPUTS[:3], dict(OUTPUTS[3], dtype="int64")], "path_confidence float32)"),
    ([OUTPUTS[1], OUTPUTS[0], *OUTPUTS[2:]], "the graph's outputs are [('confidence', 'float32 [1]')"),
])
def test_r8_the_onnx_graphs_outputs_have_the_tables_types(tmp_path, outputs, words):
    inputs = json.loads((write_package(tmp_path / "q") / "manifest.json").read_text())["inputs"]
    refused(write_package(tmp_path / "p", model=onnx_graph(inputs, outputs)), words)


@pytest.mark.parametrize("version", [2, 3, 4])
@pytest.mark.parametrize("k,shape,words", [(0, [16], "(R9)"), (4, [2], "(R9)"), (4, [1, 1], "(R9)"),
                                           (3, [1, 2], "(R9)"), (0, ["batch", 16], "'batch' on some inputs only")])
def test_r9_each_input_has_its_columns_shape(tmp_path, version, k, shape, words):
    """Schema 3 and 4 fix each input's rank and first dimension; check_manifest holds schema 2 manifests (whose
    schema does not) to the same table."""
    root = write_package(tmp_path / "p", version=version)
    edit_manifest(root, lambda m: m["inputs"][k].update(shape=shape))
    with pytest.raises(PackageError, match=r"manifest.json: inputs[.:]") as e:
        Package.load(root)
    assert version >= 3 or words in str(e.value), str(e.value)


def test_r8_a_schema_3_manifest_over_a_graph_with_bool_masks_is_refused(tmp_path):
    inputs = json.loads((write_package(tmp_path / "q", version=2) / "manifest.json").read_text())["inputs"]
    refused(write_package(tmp_path / "p", model=onnx_graph(inputs)),
            "input intent_mask is bool [2] in the graph, the manifest's inputs.3 says int32 [2]")


def test_r11_bucket_methods_differ(tmp_path):
    root = write_package(tmp_path / "p")
    (root / "model.pte").write_bytes(b"not read by these checks")

    def edit(m):
        m["models"]["executorch"] = "model.pte"
        m["files"]["model.pte"] = {"sha256": "0" * 64, "bytes": 1}
        m["buckets"] = {"executorch": [{"max_len": 8, "method": "forward_8"}, {"max_len": 12, "method": "forward_8"},
                                       {"max_len": 16, "method": "forward"}]}

    edit_manifest(root, edit)
    with pytest.raises(PackageError, match=re.escape("buckets.executorch: method names must differ")):
        Package.load(root, verify=False)


@pytest.mark.parametrize("k,oos_id,ok", [(0, 2, "a"), (1, 2, "b"), (2, 2, "oos"), (2, 1, None), (-1, 2, None),
                                         (3, 2, None), (1, 1, "b")])
def test_r12_an_intent_id_out_of_range_is_refused_never_another_name(k, oos_id, ok):
    labels = {"intents": ["a", "b"]}
    if ok is None:
        with pytest.raises(PackageError, match=f"intents has 2 names \\(decoding.oos_id {oos_id}\\), the graph "
                                               f"answered intent id {k}"):
            intent_name(k, labels, oos_id)
    else:
        assert intent_name(k, labels, oos_id) == ok


@pytest.mark.parametrize("labels,decoding,words", [
    ({"intents": ["a", "b"], "slot_tags": ["O"]}, {"oos_answer": "none"}, "decoding.oos_answer: 'none': with oos_id 2"),
    ({"intents": ["a", "b"], "slot_tags": ["O"], "oos_label": "a"}, {}, "oos_label: 'a' does not agree"),
    ({"intents": ["a", "b"], "slot_tags": ["O"], "oos_label": "a"}, {"oos_id": 0, "oos_answer": "b"},
     "oos_label: 'a' does not agree with the manifest's decoding.oos_id 0 and oos_answer 'b'"),
    ({"intents": ["a", "b"], "slot_tags": ["O"]}, {"oos_id": 0, "oos_answer": "a"}, "oos_label: None does not agree"),
    ({"intents": ["a", "b"], "slot_tags": ["O"]}, {"allowed_intents": ["a", "c"]},
     "decoding.allowed_intents names 'c', which is not one of them"),
])
def test_r13_r14_the_out_of_scope_fields_agree(tmp_path, labels, decoding, words):
    root = write_package(tmp_path / "p", labels=labels)
    edit_manifest(root, lambda m: m["decoding"].update(decoding))
    refused(root, words)


def test_r13_a_data_class_as_the_rejection_loads(tmp_path):
    root = write_package(tmp_path / "p", labels={"intents": ["a", "oos"], "slot_tags": ["O"], "oos_label": "oos"})
    edit_manifest(root, lambda m: m["decoding"].update(oos_id=1))
    assert Package.load(root).answerable is None


@pytest.fixture
def fixture_copy(tmp_path):
    return Path(shutil.copytree(FIXTURE, tmp_path / "pkg"))


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_r14_an_allow_list_outside_what_the_graph_can_answer_is_refused(fixture_copy, runtime):
    intents = json.loads((fixture_copy / "labels.json").read_text())["intents"]
    g = intents[:3]
    edit_manifest(fixture_copy, lambda m: m["decoding"].update(allowed_intents=g))
    p = Predictor.open(fixture_copy, runtime)
    with pytest.raises(ValueError, match=re.escape(f"allow_intents: none of {[intents[5]]} can be answered by this "
                                                   "package (decoding.allowed_intents)")):
        p.predict("play queen", allow_intents=[intents[5]])
    with pytest.raises(ValueError, match="allow_intents\\[1\\]: none of"):
        p.predict_batch(["play queen", "wake me up"], allow_intents=[[intents[0]], [intents[5]]])
    p.predict("play queen", allow_intents=[intents[0], intents[5]])  # a name outside G is accepted


class Answers:
    """A backend that answers what it is given (intent id, confidence, tag ids), as a graph with other ids would."""

    def __init__(self, k: int, tags: list[int]):
        self.k, self.tags = k, tags

    def run(self, *inputs):
        T = inputs[0].shape[-1]
        tags = np.asarray([self.tags + [999] * (T - len(self.tags))], np.int64)  # (1, T): garbage past the words
        return [np.asarray([self.k], np.int64), np.asarray([0.9], np.float32), tags]


@pytest.mark.parametrize("k,tags,oos_id,want", [
    (10, [0, 0], 10, "oos"),  # the reserved id: oos_answer; the columns past the 2 words hold 999, never read
    (2, [1, 2], 10, None),
    (11, [0, 0], 10, "intents has 10 names (decoding.oos_id 10), the graph answered intent id 11"),
    (-1, [0, 0], 10, "intents has 10 names (decoding.oos_id 10), the graph answered intent id -1"),
    (10, [0, 0], 3, "intents has 10 names (decoding.oos_id 3), the graph answered intent id 10"),
    (0, [0, 31], 10, "slot_tags has 31 names, the graph answered tag id 31"),
])
def test_r12_the_predictor_refuses_ids_out_of_range(fixture_copy, k, tags, oos_id, want):
    p = Predictor.open(fixture_copy, "onnx")
    p.backend, p.oos_id = Answers(k, tags), oos_id
    if want is None or want == "oos":
        ans = p.predict("play queen")
        assert ans["intent"] == (want or p.labels["intents"][k]) and len(ans["tags"]) == 2
    else:
        with pytest.raises(PackageError, match=re.escape(want)):
            p.predict("play queen")


def test_r14_the_build_writes_what_the_graph_can_choose():
    from edgekit.engine.stages.package import answerable

    labels = {"intents": ["a", "b", "oos"], "slot_tags": ["O"], "oos_label": "oos"}
    assert answerable(labels, {"oos_in_softmax": True}) is None
    assert answerable(labels, {"oos_in_softmax": False}) == ["a", "b"]
    assert answerable(labels, {"allowed_intents": ["b", "oos"], "oos_in_softmax": False}) == ["b"]
    assert answerable({"intents": ["a", "b"], "slot_tags": []}, {"allowed_intents": ["a"]}) == ["a"]


def test_r14_a_schema_2_package_takes_the_oos_class_out_of_g_by_its_policy(tmp_path):
    labels = {"intents": ["a", "b", "oos"], "slot_tags": ["O"], "oos_label": "oos"}
    root = write_package(tmp_path / "p", version=2, labels=labels)
    edit_manifest(root, lambda m: m["decoding"].update(oos_id=2, policy="threshold on in-scope intents (energy)"))
    assert Package.load(root).answerable == ["a", "b"]
    edit_manifest(root, lambda m: m["decoding"].update(policy="oos class + threshold"))
    assert Package.load(root).answerable is None


def test_r3_an_integer_a_double_cannot_hold_is_refused_as_1e400_is(tmp_path):
    root = write_package(tmp_path / "p")
    raw = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(raw.replace('"timeout_s": 0.3', '"timeout_s": ' + "9" * 400))
    refused(root, "invalid JSON (99999999999999999999... is out of the range of a double)")

