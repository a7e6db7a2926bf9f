"""The package format: a folder with manifest.json, labels.json, tokenizer files and one model per runtime.

This module is the whole contract between the build side and the app side.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
# The runtimes a package may carry, by the name manifests, profiles and --runtime use, and as people read them.
RUNTIME_NAMES = {"executorch": "ExecuTorch", "onnx": "ONNX Runtime"}
RUNTIMES = tuple(RUNTIME_NAMES)
MODEL_FILES = {"executorch": "model.pte", "onnx": "model.onnx"}  # each runtime's model file in a package
SCHEMA_FILE = "manifest.schema.json"  # JSON Schema of the manifest: the runtime's copy, shipped in every package
SCHEMA_PATH = Path(__file__).parent / SCHEMA_FILE


def package_dir(root: str | Path) -> Path:
    """`root` as a Path, or PackageError when it is not a folder (one line: missing, or a file)."""
    root = Path(root)
    if not root.is_dir():
        raise PackageError(f"{root}: " + ("a file, not a package folder" if root.exists() else
                                          "no such package directory"))
    return root


class PackageError(Exception):
    """The folder is not a valid edgekit package."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# The build writes these beside the package (report and its plots, edgekit.reporting.plots.PLOTS); not part of it.
REPORTS = ("report.json", "report.md", "oos_curve.png", "stages.png")


@functools.cache
def schema() -> dict:
    """The JSON Schema this runtime holds manifests to (its own copy: a package's copy is data, not authority)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _constant(name: str):
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def strict_json(text: str):
    """json.loads without Python's NaN, Infinity and -Infinity extensions (no JSON parser elsewhere reads them, and
    a schema's minimum/maximum cannot catch NaN)."""
    return json.loads(text, parse_constant=_constant)


@functools.cache
def _validator():
    import jsonschema

    # JSON Schema counts 16.0 as an integer; a manifest's counts and ids are written as integers, so only those
    ints = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=ints)(schema())


def check_manifest(m: object, where: str = MANIFEST) -> dict:
    """The manifest against manifest.schema.json, before any field is used, then what a schema cannot say (every
    file the manifest points to is listed in `files`): one line naming the field on failure."""
    import jsonschema

    if not isinstance(m, dict):
        raise PackageError(f"{where}: expected a JSON object, got {type(m).__name__}")
    if m.get("schema_version") != SCHEMA_VERSION:
        raise PackageError(f"{where}: schema_version {m.get('schema_version')!r}, this runtime reads {SCHEMA_VERSION}"
                           + (" (rebuild the package with this edgekit)" if m.get("schema_version") == 1 else ""))
    err = jsonschema.exceptions.best_match(_validator().iter_errors(m))
    if err is not None:
        field = ".".join(map(str, err.absolute_path)) or "(the manifest)"
        what = err.schema.get("description") if err.validator == "pattern" else None  # not the regex itself
        raise PackageError(f"{where}: {field}: " + (f"{err.instance!r} is not {what}" if what else err.message))
    files, models, tok = m["files"], m["models"], m["tokenizer"]
    refs = {f"models.{k}": v for k, v in models.items()} | {"labels": m["labels"], "tokenizer.file": tok["file"],
                                                           "schema": m["schema"]}
    if "tensorrt_model" in m:
        refs["tensorrt_model"] = m["tensorrt_model"]
    for key, name in refs.items():
        if name not in files:
            raise PackageError(f"{where}: {key}: {name!r} is not listed in files (its sha256 would not be checked)")
    T, n_int, buckets = m["max_len"], m["label_sets"]["intents"], m.get("buckets", {})
    lengths = [b["max_len"] for b in buckets.get("executorch", [])]
    facts = [  # what the schema cannot say: the fields agree with one another
        ("primary_runtime", m["primary_runtime"] in models, f"{m['primary_runtime']!r} has no model in models"),
        ("buckets", set(buckets) <= set(models), "names a runtime that has no model"),
        ("buckets.executorch", lengths == sorted(set(lengths)), "not shortest first"),
        ("buckets.executorch", not lengths or lengths[-1] == T, f"the last bucket must be max_len {T}"),
        ("decoding.oos_id", m["decoding"]["oos_id"] <= n_int, f"above the {n_int} intents"),
        ("inputs", [i["shape"][-1] for i in m["inputs"]][:4] == [T, T, T - 2, n_int],
         f"shapes must end in {T}, {T}, {T - 2} and {n_int} (max_len, max_len - 2, label_sets.intents)"),
        ("inputs", len({i["shape"][0] == "batch" for i in m["inputs"]}) == 1, "'batch' on some inputs only"),
        ("seq_axis", m.get("seq_axis") != "dynamic" or m["inputs"][0]["shape"][0] == "batch",
         "dynamic needs a batched graph ('batch' inputs)"),
        ("outputs", len(m["outputs"]) == (3 if m["label_sets"]["slot_tags"] else 2), "tags exactly when slot_tags > 0"),
    ]
    for field, ok, why in facts:
        if not ok:
            raise PackageError(f"{where}: {field}: {why}")
    return m


@dataclass
class Package:
    root: Path
    manifest: dict
    labels: dict
    digest: str = ""  # sha256 of manifest.json: pins the whole package (the manifest holds every file's sha256)

    @classmethod
    def load(cls, root: str | Path, verify: bool = True, digest: str | None = None) -> "Package":
        """Read and check a package folder: the manifest's schema, every file it points to listed and inside the
        folder, each file present with its sha256 and size; with `digest`, the manifest's own sha256."""
        root = package_dir(root)
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise PackageError(f"{mpath}: missing; is {root} an edgekit package?")
        raw = mpath.read_bytes()
        own = hashlib.sha256(raw).hexdigest()
        if digest is not None and own != digest.removeprefix("sha256:").lower():
            raise PackageError(f"{mpath}: package digest sha256:{own} is not the pinned {digest}")
        try:
            manifest = strict_json(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise PackageError(f"{mpath}: not UTF-8 (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise PackageError(f"{mpath}:{e.lineno}: invalid JSON ({e.msg})") from None
        check_manifest(manifest, str(mpath))
        inside = root.resolve()
        for name, meta in manifest["files"].items():
            f = root / name
            if not f.is_file():
                raise PackageError(f"{f}: listed in the manifest but missing")
            if f.resolve().parent != inside:
                raise PackageError(f"{f}: a link that leaves the package folder")
            if verify and sha256(f) != meta["sha256"]:
                raise PackageError(f"{f}: sha256 differs from the manifest (corrupted or edited)")
            if f.stat().st_size != meta["bytes"]:
                raise PackageError(f"{f}: {f.stat().st_size} bytes, the manifest says {meta['bytes']} (truncated or "
                                   "edited)")
        try:
            labels = strict_json((root / manifest["labels"]).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PackageError(f"{root / manifest['labels']}: not valid JSON ({e})") from None
        if not isinstance(labels, dict) or not isinstance(labels.get("intents"), list):
            raise PackageError(f"{root / manifest['labels']}: expected an object with an intents list")
        for key in ("intents", "slot_tags"):
            if len(labels.get(key) or []) != manifest["label_sets"][key]:
                raise PackageError(f"{root / manifest['labels']}: {key}: {len(labels.get(key) or [])} names, the "
                                   f"manifest's label_sets.{key} says {manifest['label_sets'][key]}")
        return cls(root, manifest, labels, own)

    def strays(self) -> list[str]:
        """Files in the folder the manifest does not list (the build's report.json and report.md excepted)."""
        known = set(self.manifest["files"]) | {MANIFEST, *REPORTS}
        return sorted(p.name for p in self.root.iterdir() if p.name not in known)

    def check_strays(self) -> None:
        """PackageError naming the first file the manifest does not list (edgekit verify, edgekit doctor)."""
        stray = self.strays()
        if stray:
            raise PackageError(f"{self.root}: stray file {stray[0]!r} is not listed in the manifest"
                               + (f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""))
    @property
    def max_len(self) -> int:
        return int(self.manifest["max_len"])

    def buckets(self, runtime: str) -> list[dict] | None:
        """Length buckets of `runtime`'s model, shortest first: [{"max_len", "method"}] (None: one length)."""
        return self.manifest.get("buckets", {}).get(runtime)

    @property
    def batched(self) -> bool:
        """The graph has a dynamic batch axis (server profiles): its inputs' first dimension is "batch"."""
        return self.manifest["inputs"][0]["shape"][0] == "batch"

    @property
    def onnx_disabled_optimizers(self) -> list[str]:
        """ONNX Runtime graph optimizers a session of the ONNX model leaves out (the manifest's field; none)."""
        return self.manifest.get("onnx_disabled_optimizers", [])

    @property
    def dynamic_seq(self) -> bool:
        """input_ids and attention_mask may be cut to a batch's longest utterance (the manifest's `seq_axis`)."""
        return self.manifest.get("seq_axis") == "dynamic"

    def model_path(self, runtime: str) -> Path:
        models = self.manifest["models"]
        if runtime not in models:
            raise PackageError(f"{self.root}: no model for runtime {runtime!r} (has {', '.join(models)})")
        return self.root / models[runtime]
