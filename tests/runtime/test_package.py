"""The manifest as the root of trust: schema, paths, listed files, digest, stray files and `edgekit verify`, on a
small hand-made package (no model is loaded by these checks)."""

import hashlib
import json
import re
import subprocess
import sys

import pytest

from edgekit.runtime.package import SCHEMA_FILE, SCHEMA_PATHS, SCHEMA_VERSION, Package, PackageError

FILES = ["model.onnx", "tokenizer.model", "labels.json", SCHEMA_FILE]


def proto(*fields: tuple[int, int | bytes | str]) -> bytes:
    """A protobuf message from (field number, value) pairs: an int is a varint, bytes or str a length-delimited
    field (a nested message, a string)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += varint(number << 3) + varint(value)
        else:
            data = value.encode() if isinstance(value, str) else value
            out += varint(number << 3 | 2) + varint(len(data)) + data
    return out


DTYPES = {"int64": 7, "int32": 6, "float32": 1, "bool": 9}  # ONNX TensorProto.DataType
OUTPUTS = [{"name": "intent", "dtype": "int64", "shape": [1]}, {"name": "confidence", "dtype": "float32", "shape": [1]},
           {"name": "tags", "dtype": "int64", "shape": [1, 16]}, {"name": "path_confidence", "dtype": "float32",
                                                                "shape": [1]}]


def onnx_graph(inputs: list[dict], outputs: list[dict] = OUTPUTS) -> bytes:
    """An ONNX ModelProto whose graph declares `inputs` and `outputs` (the manifest's {"name", "dtype", "shape"})
    and nothing else: what Package.load reads of a model."""
    def value_info(i: dict) -> bytes:
        dims = [proto((2, d) if isinstance(d, str) else (1, d)) for d in i["shape"]]
        tensor = proto((1, DTYPES[i["dtype"]]), (2, proto(*[(1, d) for d in dims])))
        return proto((1, i["name"]), (2, proto((1, tensor))))

    return proto((1, 8), (7, proto((2, "g"), *[(11, value_info(i)) for i in inputs],
                                   *[(12, value_info(o)) for o in outputs])))


SPECIAL = [("<pad>", 3), ("<unk>", 2), ("[CLS]", 3), ("[SEP]", 3)]  # text, SentencePiece type (R5)


def spm_model(n: int, special=SPECIAL, normalizer: str | None = "edgekit_bert_basic") -> bytes:
    """A SentencePiece ModelProto of n pieces (the four special ones first, of their types) and its normalizer."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    for name, kind in list(special) + [(chr(97 + k), 1) for k in range(n - len(special))]:
        m.pieces.add(piece=name, score=0.0, type=kind)
    if normalizer is not None:
        m.normalizer_spec.name = normalizer
    return m.SerializeToString()


INPUTS = [{"name": "input_ids", "dtype": "int64", "shape": [1, 16]},
          {"name": "attention_mask", "dtype": "int64", "shape": [1, 16]},
          {"name": "word_pos", "dtype": "int64", "shape": [1, 14]},
          {"name": "intent_mask", "dtype": "int32", "shape": [2]},
          {"name": "reject", "dtype": "int32", "shape": [1]}]
MODEL = onnx_graph(INPUTS)  # the hand-made package's model.onnx (schema 4)
LABELS = {"intents": ["a", "b"], "slot_tags": ["O"], "oos_label": None}


def write_package(root, version: int = SCHEMA_VERSION, labels: dict = LABELS, tokenizer: bytes | None = None,
                  model: bytes | None = None, **over):
    """A package folder whose model and tokenizer are the least Package.load reads (the graph's inputs and
    outputs, 8 pieces), with a full manifest of schema `version` (2: bool masks) listing them (`over` edits it)."""
    root.mkdir(parents=True, exist_ok=True)
    T, inputs = 16, json.loads(json.dumps(INPUTS))
    inputs[3]["shape"] = [len(labels["intents"])]
    if version == 2:
        inputs[3]["dtype"] = inputs[4]["dtype"] = "bool"
    outputs = OUTPUTS[: 4 if version >= 4 else 3]  # schema 4 adds path_confidence
    files = {"model.onnx": model or onnx_graph(inputs, outputs), "tokenizer.model": tokenizer or spm_model(8),
             "labels.json": json.dumps(labels).encode(), SCHEMA_FILE: SCHEMA_PATHS[version].read_bytes()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    m = {"schema_version": version, "schema": SCHEMA_FILE, "created_by": "edgekit test", "task": "intent",
         "profile": "android", "max_len": T,
         "tokenizer": {"type": "sentencepiece", "file": "tokenizer.model", "normalizer": "edgekit_bert_basic",
                       "lowercase": True, "vocab_size": 8, "special_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3}},
         "labels": "labels.json", "label_sets": {"intents": len(labels["intents"]), "slot_tags": 1},
         "inputs": inputs,
         "outputs": [o["name"] for o in outputs],
         "decoding": {"policy": "threshold", "score": "confidence", "threshold": 0.5, "temperature": 1.0,
                      "oos_id": len(labels["intents"]), "allowed_intents": None, "oos_answer": "oos"},
         "models": {"onnx": "model.onnx"}, "primary_runtime": "onnx",
         "cascade": {"threshold": None, "timeout_s": 0.3} | ({"score": "path_confidence"} if version >= 4 else {}),
         "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in files.items()}}
    m.update(over)
    (root / "manifest.json").write_text(json.dumps(m, indent=1))
    return root


def digest(root) -> str:
    return hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()


def verify(root, *args):
    return subprocess.run([sys.executable, "-m", "edgekit.cli", "verify", str(root), *args], capture_output=True,
                          text=True)


def test_a_good_package_loads_and_its_digest_is_the_manifests_sha256(tmp_path):
    root = write_package(tmp_path / "p")
    pkg = Package.load(root, digest=digest(root))
    assert pkg.digest == digest(root) and pkg.labels["intents"] == ["a", "b"]
    (root / "report.json").write_text("{}")  # the build's reports may sit beside the package
    out = verify(root, "--digest", "sha256:" + digest(root))
    assert out.returncode == 0, out.stderr
    assert len([line for line in out.stdout.splitlines() if line.startswith("ok  ")]) == len(FILES)
    assert f"digest sha256:{digest(root)}" in out.stdout


@pytest.mark.parametrize("edit,words", [
    (lambda m: m.update(labels="../labels.json"), "labels: '../labels.json' is not a plain file name inside the"),
    (lambda m: m.update(labels="/etc/passwd"), "labels: '/etc/passwd' is not a plain file name"),
    (lambda m: m["tokenizer"].update(file="sub/tokenizer.model"), "tokenizer.file: 'sub/tokenizer.model' is not"),
    (lambda m: m["tokenizer"].update(file=".."), "tokenizer.file: '..' is not a plain file name"),
    (lambda m: m["models"].update(executorch="model.pte"), "models.executorch: 'model.pte' is not listed in files"),
    (lambda m: m.update(schema="other.json"), "schema: 'other.json' is not listed in files"),
    (lambda m: m.update(files={}), "files: {} should be non-empty"),
    (lambda m: m.pop("files"), "'files' is a required property"),
    (lambda m: m.update(max_len=4), "max_len: 4 is less than the minimum of 8"),
    (lambda m: m.update(max_len=-5), "max_len: -5 is less than the minimum"),
    (lambda m: m.update(max_len="16"), "max_len: '16' is not of type 'integer'"),
    (lambda m: m["tokenizer"].update(type="bpe"), "tokenizer.type: 'sentencepiece' was expected"),
    (lambda m: m["tokenizer"].update(normalizer="identity"), "tokenizer.normalizer: 'edgekit_bert_basic' was"),
    (lambda m: m["tokenizer"]["special_ids"].pop("cls"), "tokenizer.special_ids: 'cls' is a required property"),
    (lambda m: m["inputs"][2].update(name="word_ids"), "inputs.2.name: 'word_pos' was expected"),
    (lambda m: m["decoding"].update(score="margin"), "decoding.score: 'margin' is not one of"),
    (lambda m: m["cascade"].update(threshold=1.5), "cascade.threshold: 1.5 is greater than the maximum of 1"),
    (lambda m: m.update(extra_field=1), "Additional properties are not allowed ('extra_field' was unexpected)"),
    (lambda m: m.update(label_sets={"intents": 2, "slot_tags": 2}), "slot_tags: 1 names, the manifest's label_sets"),
    (lambda m: m.update(schema_version=1), "schema_version 1, this runtime reads 2, 3 and 4 (rebuild the package"),
    (lambda m: m.update(schema_version=5), "schema_version 5, this runtime reads 2, 3 and 4"),
    (lambda m: m["files"]["model.onnx"].update(sha256="xyz"), "files.model.onnx.sha256: 'xyz' does not match"),
    (lambda m: m["cascade"].update(timeout_s=float("inf")), "invalid JSON (Infinity is not JSON)"),
    (lambda m: m["decoding"].update(temperature=float("nan")), "invalid JSON (NaN is not JSON)"),
    (lambda m: m.update(max_len=16.5), "max_len: 16.5 is not of type 'integer'"),
    (lambda m: m.update(primary_runtime="executorch"), "primary_runtime: 'executorch' has no model in models"),
    (lambda m: m["decoding"].update(oos_id=3), "decoding.oos_id: above the 2 intents"),
    (lambda m: m["inputs"][2].update(shape=[1, 16]), "inputs: shapes [[1, 16], [1, 16], [1, 16], [2], [1]], expected"),
    (lambda m: m.update(outputs=["intent", "confidence"]),
     "outputs: tags and path_confidence exactly when slot_tags > 0"),
    (lambda m: m.update(outputs=["intent", "confidence", "tags"]), "outputs: tags and path_confidence exactly when"),
    (lambda m: m["cascade"].pop("score"), "cascade: 'score' is a required property"),
    (lambda m: m.update(outputs=["intent", "confidence"], label_sets={"intents": 2, "slot_tags": 0}),
     "cascade.score: 'path_confidence' is not one of the outputs ['intent', 'confidence']"),
    (lambda m: m.update(buckets={"executorch": [{"max_len": 8, "method": "forward_8"},
                                                {"max_len": 16, "method": "forward"}]}),
     "buckets: names a runtime that has no model"),
    (lambda m: m["files"].update({"manifest.json": m["files"]["labels.json"]}), "files: 'manifest.json' should not"),
    (lambda m: m["files"]["model.onnx"].update(bytes=len(MODEL) - 1),
     f"{len(MODEL)} bytes, the manifest says {len(MODEL) - 1}"),
])
def test_manifest_defects_are_one_clear_error(tmp_path, edit, words):
    root = write_package(tmp_path / "p")
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackageError, match=re.escape(words)):
        Package.load(root)
    out = verify(root)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("error:")


@pytest.mark.parametrize("text,words", [("[1, 2]", "expected a JSON object, got list"), ("{", "invalid JSON"),
                                        (b"\xff\xfe{}", "not UTF-8")])
def test_a_manifest_that_is_not_an_object_is_refused(tmp_path, text, words):
    root = write_package(tmp_path / "p")
    (root / "manifest.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PackageError, match=words):
        Package.load(root)


def test_every_single_byte_flip_is_refused(tmp_path):
    """Each byte of each file flipped in turn: the files by their sha256, the manifest by the pinned digest."""
    root = write_package(tmp_path / "p")
    pinned = digest(root)
    refused = total = 0
    for name in [*FILES[:3], "manifest.json"]:  # the schema copy (6 KB) is a listed file like the others
        original = (root / name).read_bytes()
        for i in range(len(original)):
            flipped = bytearray(original)
            flipped[i] ^= 0x01
            (root / name).write_bytes(bytes(flipped))
            total += 1
            try:
                Package.load(root, digest=pinned)
            except PackageError:
                refused += 1
        (root / name).write_bytes(original)
    assert refused == total > 400


def test_stray_files_links_out_and_a_wrong_digest_are_refused(tmp_path):
    root = write_package(tmp_path / "p")
    (root / "extra.bin").write_bytes(b"x")
    out = verify(root)
    assert out.returncode == 2 and "stray file 'extra.bin'" in out.stderr
    (root / "extra.bin").unlink()
    out = verify(root, "--digest", "0" * 64)
    assert out.returncode == 2 and "is not the pinned" in out.stderr
    outside = tmp_path / "outside.json"
    outside.write_bytes((root / "labels.json").read_bytes())
    (root / "labels.json").unlink()
    (root / "labels.json").symlink_to(outside)
    with pytest.raises(PackageError, match="leaves the package folder"):
        Package.load(root)
