"""The package format: a folder with manifest.json, labels.json, tokenizer files and one model per runtime.

This module is the whole contract between the build side and the app side.
"""

from __future__ import annotations

import hashlib
import json
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


@dataclass
class Package:
    root: Path
    manifest: dict
    labels: dict

    @classmethod
    def load(cls, root: str | Path, verify: bool = True) -> "Package":
        """Read and check a package folder: manifest schema, files present, sha256 matching."""
        root = Path(root)
        if not root.is_dir():
            raise PackageError(f"{root}: no such package directory")
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise PackageError(f"{mpath}: missing; is {root} an edgekit package?")
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise PackageError(f"{mpath}:{e.lineno}: invalid JSON ({e.msg})") from None
        if manifest.get("schema_version") != SCHEMA_VERSION:
            raise PackageError(f"{mpath}: schema_version {manifest.get('schema_version')!r}, "
                               f"this runtime reads {SCHEMA_VERSION}")
        for name, meta in manifest["files"].items():
            f = root / name
            if not f.is_file():
                raise PackageError(f"{f}: listed in the manifest but missing")
            if verify and sha256(f) != meta["sha256"]:
                raise PackageError(f"{f}: sha256 differs from the manifest (corrupted or edited)")
        labels = json.loads((root / manifest["labels"]).read_text(encoding="utf-8"))
        return cls(root, manifest, labels)

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
