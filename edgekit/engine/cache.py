"""The stage cache: each stage's output stored under a key of everything that made it.

key = sha256 of (stage name, its resolved settings, the key of its input, the edgekit version); the teacher's
input is a digest of the data (its parsed splits by role, its files by path) and the base model's files
(edgekit.engine.keys.input_digest). So a stage is reused exactly when nothing that made it changed, across output
folders and targets. Entries are written to a temp folder and renamed in place, so a killed build leaves no half
entry; an entry that fails to load is rebuilt, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgekit import __version__
from edgekit.errors import EdgekitError

log = logging.getLogger("edgekit")
RESULT = "result.json"


def default_dir(arg: str | None = None) -> Path:
    """--cache DIR, else $EDGEKIT_CACHE, else the user's cache folder."""
    if arg:
        return Path(arg).expanduser().resolve()
    if os.environ.get("EDGEKIT_CACHE"):
        return Path(os.environ["EDGEKIT_CACHE"]).expanduser().resolve()
    return (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "edgekit").resolve()


def walk_files(folder: Path) -> list[Path]:
    """Every file under `folder`, sorted, as paths under it. Links to folders and files are followed: a split folder
    that is a link holds data too (Path.rglob does not enter one on Python 3.11). A link to a folder that holds it
    (a loop, where a walk would never end) is refused in one line; what cannot be stat'ed (a dangling link) is no
    file."""
    out: list[Path] = []
    stack = [(Path(folder), frozenset({_ident(Path(folder))}))]
    while stack:
        here, above = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError as e:
            raise EdgekitError(f"{here}: cannot be read ({e.strerror or e})") from None
        for entry in entries:
            path = Path(entry.path)
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
                ident = _ident(path) if is_dir else None
            except OSError:  # a link to itself, or to nothing: not data
                continue
            if is_dir and ident in above:
                raise EdgekitError(f"{path}: a link to {os.path.realpath(path)}, a folder that holds it (a loop); "
                                   "remove the link")
            if is_dir:
                stack.append((path, above | {ident}))
            elif is_file:
                out.append(path)
    return sorted(out)


def _ident(path: Path) -> tuple[int, int]:
    st = path.stat()  # the folder a link points to: two names of one folder are one identity
    return st.st_dev, st.st_ino


def digest_files(paths: list[Path], root: Path | None = None) -> str:
    """sha256 over the files' names, sizes and bytes. Names are relative to `root` where it is given (the data
    folder); without it a file is named by its base name and a folder's files relative to that folder. Folders are
    walked sorted and links followed (walk_files): a linked file is keyed by the content it points to."""
    h = hashlib.sha256()
    files = []
    for p in paths:
        base = root if root is not None else p
        files += [(x, x.relative_to(base).as_posix()) for x in walk_files(p)] if p.is_dir() \
            else [(p, p.relative_to(root).as_posix() if root is not None else p.name)]
    for f, name in files:
        h.update(name.encode() + b"\0" + str(f.stat().st_size).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def stage_key(stage: str, settings: dict, input_key: str) -> str:
    blob = json.dumps({"stage": stage, "settings": settings, "input": input_key, "edgekit": __version__},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Entry:
    stage: str
    key: str
    path: Path
    result: dict

    @property
    def short(self) -> str:
        return self.key[:12]


class StageCache:
    """Entries live in `root/<stage>/<key>/` with the stage's files and `result.json`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def get(self, stage: str, key: str) -> Entry | None:
        path = self.root / stage / key
        if not path.is_dir():
            return None
        try:
            result = json.loads((path / RESULT).read_text())
            missing = [f for f in result.get("_files", []) if not (path / f).is_file()]
            if missing:
                raise ValueError(f"missing {missing[0]}")
            for f in result.get("_files", []):  # a truncated file is as bad as a missing one
                if f in result.get("_sizes", {}) and (path / f).stat().st_size != result["_sizes"][f]:
                    raise ValueError(f"{f} has the wrong size")
        except (OSError, ValueError) as e:
            log.warning("cache entry %s/%s is unreadable (%s): rebuilding it", stage, key[:12], e)
            self.drop(stage, key)
            return None
        try:
            os.utime(path)  # last use, for `edgekit cache prune --older-than`
        except OSError:  # a read-only cache still serves its entries
            pass
        return Entry(stage, key, path, result)

    def workdir(self, stage: str) -> Path:
        """A fresh folder for a stage's files; `put` moves it into place."""
        tmp = self.root / "tmp"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=f"{stage}.", dir=tmp))
        except OSError as e:  # a read-only cache serves its entries; a stage it lacks cannot run there
            raise EdgekitError(f"--cache {self.root}: cannot write the {stage} stage there ({e.strerror or e}); "
                               "give a writable --cache or set EDGEKIT_CACHE") from None

    def put(self, stage: str, key: str, work: Path, result: dict) -> Entry:
        """Write result.json into `work`, then rename `work` to the entry's place (atomic on one filesystem)."""
        files = sorted(p for p in work.iterdir() if p.name != RESULT)
        result = {**result, "_files": [p.name for p in files], "_sizes": {p.name: p.stat().st_size for p in files},
                  "_created": time.time()}
        (work / RESULT).write_text(json.dumps(result, indent=1, default=str))
        final = self.root / stage / key
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(work, final)
        except OSError:  # a concurrent build made the same entry (keys name their content): keep that one
            shutil.rmtree(work, ignore_errors=True)
            if not final.is_dir():
                raise
        return Entry(stage, key, final, result)

    def drop(self, stage: str, key: str) -> None:
        path = self.root / stage / key
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:  # an entry that is one file: the label-issue search's features and probabilities (features/)
            path.unlink(missing_ok=True)

    def entries(self) -> list[dict]:
        """Every entry: stage, key, bytes, last use (seconds since the epoch)."""
        out = []
        for stage_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != "tmp") \
                if self.root.is_dir() else []:
            for e in sorted(stage_dir.iterdir()):
                files = [e] if e.is_file() else [f for f in e.rglob("*") if f.is_file()]
                size = sum(f.stat().st_size for f in files)
                out.append({"stage": stage_dir.name, "key": e.name, "bytes": size, "used": e.stat().st_mtime})
        return out

    def prune(self, older_than_days: float | None = None) -> tuple[int, int]:
        """Remove entries not used for `older_than_days` (None: all) and stale temp folders; (count, bytes)."""
        now, n, freed = time.time(), 0, 0
        for e in self.entries():
            if older_than_days is None or now - e["used"] > older_than_days * 86400:
                self.drop(e["stage"], e["key"])
                n, freed = n + 1, freed + e["bytes"]
        tmp = self.root / "tmp"
        if tmp.is_dir():
            for p in tmp.iterdir():  # left by killed builds; a running build's is younger than a day
                if older_than_days is None or now - p.stat().st_mtime > 86400:
                    shutil.rmtree(p, ignore_errors=True)
        return n, freed


def built_entry(package: Path, stages: tuple[str, ...]) -> tuple[Path, dict] | None:
    """The cache entry of the last of `stages` the build of `package` made or reused, and that build's report;
    None when the package has no report or the entry was pruned from the cache."""
    report = Path(package) / "report.json"
    if not report.is_file():
        return None
    rep = json.loads(report.read_text())
    root = Path(rep.get("config", {}).get("cache", ""))
    row = next((r for r in reversed(rep.get("stages", [])) if r["name"] in stages and r.get("key")), None)
    if row is None or not (root / row["name"] / row["key"]).is_dir():
        return None
    return root / row["name"] / row["key"], rep
