"""The manifest as the root of trust: schema, paths, listed files, digest, stray files and `edgekit verify`, on a
small hand-made package (no model is loaded by these checks)."""

import hashlib
import json
import subprocess
import sys

import pytest

from edgekit.runtime.package import Package, PackageError


def write_package(root, **over):
    """A package folder whose files are small byte strings, with a manifest listing them (`over` edits it)."""
    root.mkdir(parents=True, exist_ok=True)
    files = {"model.onnx": bytes(range(40)), "tokenizer.model": b"spm-model-bytes", "labels.json":
             json.dumps({"intents": ["a", "b"], "slot_tags": ["O"]}).encode()}
    for name, data in files.items():
        (root / name).write_bytes(data)
    m = {"schema_version": 1, "created_by": "edgekit test", "max_len": 16, "labels": "labels.json",
         "tokenizer": {"type": "sentencepiece", "file": "tokenizer.model"}, "models": {"onnx": "model.onnx"},
         "primary_runtime": "onnx", "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 16]}],
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
    assert len([line for line in out.stdout.splitlines() if line.startswith("ok  ")]) == 3
    assert f"digest sha256:{digest(root)}" in out.stdout


@pytest.mark.parametrize("edit,words", [
    (lambda m: m.update(labels="../labels.json"), "not a file name inside the package"),
    (lambda m: m.update(labels="/etc/passwd"), "not a file name inside the package"),
    (lambda m: m["tokenizer"].update(file="sub/tokenizer.model"), "not a file name inside the package"),
    (lambda m: m["models"].update(executorch="model.pte"), "not listed in files"),
    (lambda m: m.update(files={}), "files: expected an object"),
    (lambda m: m.pop("files"), "files: expected an object"),
    (lambda m: m.update(max_len=4), "max_len: expected a whole number in 8..512, got 4"),
    (lambda m: m.update(max_len=-5), "max_len"),
    (lambda m: m.update(max_len="16"), "max_len"),
    (lambda m: m["tokenizer"].update(type="bpe"), "tokenizer.type: expected one of"),
    (lambda m: m.update(schema_version=2), "schema_version 2"),
    (lambda m: m["files"]["model.onnx"].update(sha256="xyz"), "files.model.onnx"),
    (lambda m: m["files"]["model.onnx"].update(bytes=39), "40 bytes, the manifest says 39"),
])
def test_manifest_defects_are_one_clear_error(tmp_path, edit, words):
    root = write_package(tmp_path / "p")
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackageError, match=words.replace(".", r"\.").replace("(", r"\(")):
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
    for name in ["model.onnx", "tokenizer.model", "labels.json", "manifest.json"]:
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
