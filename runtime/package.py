"""The package format: a folder with manifest.json, labels.json, tokenizer files and one model per runtime.

This module is the whole contract between the build side and the app side.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


class PackageError(Exception):
    """The folder is not a valid edgekit package."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


TOKENIZERS = ("sentencepiece", "wordpiece")
# The build writes these beside the package (report and its plots, edgekit.plots.PLOTS); not part of it.
REPORTS = ("report.json", "report.md", "oos_curve.png", "stages.png")
HEX = set("0123456789abcdef")


def _name(where: str, name: object) -> str:
    """A file the manifest points to: a plain name inside the package folder (no folders, no `..`, not absolute)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise PackageError(f"{where}: {name!r} is not a file name inside the package")
    return name


def check_manifest(m: object, where: str = MANIFEST) -> dict:
    """The manifest's schema, checked before any field is used: one line naming the field on failure."""
    if not isinstance(m, dict):
        raise PackageError(f"{where}: expected a JSON object, got {type(m).__name__}")
    if m.get("schema_version") != SCHEMA_VERSION:
        raise PackageError(f"{where}: schema_version {m.get('schema_version')!r}, this runtime reads {SCHEMA_VERSION}")
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise PackageError(f"{where}: files: expected an object listing the package's files")
    for name, meta in files.items():
        _name(f"{where}: files", name)
        ok = (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64
              and set(meta["sha256"]) <= HEX and isinstance(meta.get("bytes"), int) and meta["bytes"] >= 0)
        if not ok:
            raise PackageError(f"{where}: files.{name}: expected {{\"sha256\": 64 hex digits, \"bytes\": int}}")
    models = m.get("models")
    if not isinstance(models, dict) or not models:
        raise PackageError(f"{where}: models: expected an object {{runtime: file}}")
    tok = m.get("tokenizer")
    if not isinstance(tok, dict) or tok.get("type") not in TOKENIZERS:
        raise PackageError(f"{where}: tokenizer.type: expected one of {', '.join(TOKENIZERS)}, got "
                           f"{tok.get('type') if isinstance(tok, dict) else tok!r}")
    refs = {f"models.{k}": v for k, v in models.items()} | {"labels": m.get("labels"), "tokenizer.file": tok.get("file")}
    if "tensorrt_model" in m:
        refs["tensorrt_model"] = m["tensorrt_model"]
    for key, name in refs.items():
        if _name(f"{where}: {key}", name) not in files:
            raise PackageError(f"{where}: {key}: {name!r} is not listed in files (its sha256 would not be checked)")
    L = m.get("max_len")
    if not isinstance(L, int) or isinstance(L, bool) or not 8 <= L <= 512:
        raise PackageError(f"{where}: max_len: expected a whole number in 8..512, got {L!r}")
    cas = m.get("cascade")
    if cas is not None:
        tau, t = (cas.get("threshold"), cas.get("timeout_s")) if isinstance(cas, dict) else ("?", "?")
        if not (tau is None or (_number(tau) and 0 <= tau <= 1)) or not (_number(t) and t > 0):
            raise PackageError(f"{where}: cascade: expected {{\"threshold\": null or a confidence in [0, 1], "
                               f"\"timeout_s\": seconds > 0}}, got {cas!r}")
    return m


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
        root = Path(root)
        if not root.is_dir():
            raise PackageError(f"{root}: no such package directory")
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise PackageError(f"{mpath}: missing; is {root} an edgekit package?")
        raw = mpath.read_bytes()
        own = hashlib.sha256(raw).hexdigest()
        if digest is not None and own != digest.removeprefix("sha256:").lower():
            raise PackageError(f"{mpath}: package digest sha256:{own} is not the pinned {digest}")
        try:
            manifest = json.loads(raw.decode("utf-8"))
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
            labels = json.loads((root / manifest["labels"]).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PackageError(f"{root / manifest['labels']}: not valid JSON ({e})") from None
        if not isinstance(labels, dict) or not isinstance(labels.get("intents"), list):
            raise PackageError(f"{root / manifest['labels']}: expected an object with an intents list")
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

    def model_path(self, runtime: str) -> Path:
        models = self.manifest["models"]
        if runtime not in models:
            raise PackageError(f"{self.root}: no model for runtime {runtime!r} (has {', '.join(models)})")
        return self.root / models[runtime]
