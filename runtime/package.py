"""The package format: a folder with manifest.json, labels.json, tokenizer files and one model per runtime.

This module is the whole contract between the build side and the app side.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from edgekit.runtime.errors import PackageError
from edgekit.runtime.jsonfile import LABELS_BYTES, MANIFEST_BYTES, JSONFileError, loads, read_bounded
from edgekit.runtime.modelfacts import OUTPUT_DTYPES, check_models  # noqa: F401 (OUTPUT_DTYPES: re-exported)
from edgekit.runtime.schemas import first_error, schema  # noqa: F401 (schema: re-exported)
from edgekit.runtime.schemas import short as _short

SCHEMA_VERSION = 4  # what edgekit writes; the runtime also reads 2 (bool masks) and 3 (no path_confidence), each
# against its own schema
MANIFEST = "manifest.json"
# The runtimes a package may carry, by the name manifests, profiles and --runtime use, and as people read them.
RUNTIME_NAMES = {"executorch": "ExecuTorch", "onnx": "ONNX Runtime"}
RUNTIMES = tuple(RUNTIME_NAMES)
MODEL_FILES = {"executorch": "model.pte", "onnx": "model.onnx"}  # each runtime's model file in a package
SCHEMA_FILE = "manifest.schema.json"  # JSON Schema of the manifest: the runtime's copy, shipped in every package
SCHEMA_PATH = Path(__file__).parent / SCHEMA_FILE
SCHEMA_PATHS = {v: Path(__file__).parent / f"manifest-{v}.schema.json" for v in (2, 3)} | {SCHEMA_VERSION: SCHEMA_PATH}
MASK_DTYPES = {2: "bool", 3: "int32", 4: "int32"}  # the element type of intent_mask and reject, by schema version
SLOT_OUTPUTS = {2: ["tags"], 3: ["tags"], 4: ["tags", "path_confidence"]}  # the outputs a graph with slots adds
LABELS_SCHEMA_PATH = Path(__file__).parent / "labels.schema.json"  # the runtime's own; packages do not ship it


def package_dir(root: str | Path) -> Path:
    """`root` as a Path, or PackageError when it is not a folder (one line: missing, or a file)."""
    root = Path(root)
    try:
        is_dir = root.is_dir()
    except OSError as e:  # a name too long, a loop of links: the path and why, as for a missing folder
        raise PackageError(f"{root}: {e.strerror or e}") from None
    if not is_dir:
        raise PackageError(f"{root}: " + ("a file, not a package folder" if root.exists() else
                                          "no such package directory"))
    return root


MAX_FILE_BYTES = (2 << 30) - 1  # 2 GiB: one protobuf (an ONNX model without external data) holds no more


def sha256(path: Path | bytes | BinaryIO) -> str:
    """The hex sha256 of a file (a path or an open file, streamed from where it stands) or of bytes already read."""
    if isinstance(path, bytes):
        return hashlib.sha256(path).hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") if isinstance(path, (str, Path)) else nullcontext(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# The build writes these beside the package (report and its plots, edgekit.reporting.plots.PLOTS); not part of it.
REPORTS = ("report.json", "report.md", "oos_curve.png", "stages.png", "confusion.png", "frontier.png",
           "label_issues.jsonl")


# The manifest's numbers the schemas type "number", not "integer" (docs/package-format.md R3): every other number
# is an integer field, whose value the schema has checked is integral.
NUMBER_FIELDS = frozenset({"threshold", "temperature", "timeout_s"})


def _as_ints(value, key: str = ""):
    """`value` (schema-valid) with each integral float in an integer field made an int: the runtime slices and
    counts with them, and `16.0` is the field 16 (R3)."""
    if isinstance(value, float) and value.is_integer() and key not in NUMBER_FIELDS:
        return int(value)
    if key == "serve" and isinstance(value, dict):  # a table the schema leaves open: its one integer field
        return {**value, **({"max_batch": _as_ints(value["max_batch"])} if "max_batch" in value else {})}
    if isinstance(value, dict):
        return {k: _as_ints(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_ints(v, key) for v in value]
    return value


def _schema_check(instance, where, path: Path = SCHEMA_PATH, what: str = "(the manifest)") -> None:
    """PackageError naming the field of the best of the first errors the schema at `path` finds in `instance`."""
    why = first_error(instance, path, what)
    if why is not None:
        raise PackageError(f"{where}: {why}")


def _input_shapes(T: int, n_intents: int, batched: bool) -> list[list]:
    """The five inputs' shapes (docs/package-format.md R9): a phone package's column, or a server package's."""
    if batched:
        return [["batch", T], ["batch", T], ["batch", T - 2], ["batch", n_intents], ["batch"]]
    return [[1, T], [1, T], [1, T - 2], [n_intents], [1]]


def check_manifest(m: object, where: str = MANIFEST) -> dict:
    """The manifest against manifest.schema.json, before any field is used, then what a schema cannot say (every
    file the manifest points to is listed in `files`): one line naming the field on failure."""
    if not isinstance(m, dict):
        raise PackageError(f"{where}: expected a JSON object, got {type(m).__name__}")
    version = m.get("schema_version")
    # a list or an object is no version (nor hashable); True is not 1; 4.0 is 4 (R3)
    if isinstance(version, bool) or not isinstance(version, (int, float)) or version not in SCHEMA_PATHS:
        raise PackageError(f"{where}: schema_version {_short(version)}, this runtime reads "
                           f"{', '.join(map(str, list(SCHEMA_PATHS)[:-1]))} and {list(SCHEMA_PATHS)[-1]}"
                           + (" (rebuild the package with this edgekit)" if version == 1 else ""))
    _schema_check(m, where, SCHEMA_PATHS[version])
    m = _as_ints(m)
    files, models, tok = m["files"], m["models"], m["tokenizer"]
    refs = {f"models.{k}": v for k, v in models.items()} | {"labels": m["labels"], "tokenizer.file": tok["file"],
                                                           "schema": m["schema"]}
    if "tensorrt_model" in m:
        refs["tensorrt_model"] = m["tensorrt_model"]
    for key, name in refs.items():
        if name not in files:
            raise PackageError(f"{where}: {key}: {name!r} is not listed in files (its sha256 would not be checked)")
    big = next((n for n, f in m["files"].items() if f["bytes"] > MAX_FILE_BYTES), None)
    if big is not None:  # refused from the manifest alone, before any file is read or hashed
        raise PackageError(f"{where}: files.{big}.bytes: {m['files'][big]['bytes']}, more than the {MAX_FILE_BYTES} "
                           "bytes a package file may have (ONNX's protobuf limit)")
    if m["files"][m["labels"]]["bytes"] > LABELS_BYTES:
        raise PackageError(f"{where}: files.{m['labels']}.bytes: {m['files'][m['labels']]['bytes']}, more than the "
                           f"{LABELS_BYTES >> 20} MiB ({LABELS_BYTES} bytes) a labels file may have")
    T, n_int, buckets = m["max_len"], m["label_sets"]["intents"], m.get("buckets", {})
    lengths = [b["max_len"] for b in buckets.get("executorch", [])]
    methods = [b["method"] for b in buckets.get("executorch", [])]
    shapes = [i["shape"] for i in m["inputs"]]
    want = _input_shapes(T, n_int, shapes[0][0] == "batch")
    dec, score = m["decoding"], (m.get("cascade") or {}).get("score", "confidence")
    facts = [  # what the schema cannot say: the fields agree with one another
        ("inputs", len({s[0] == "batch" for s in shapes}) == 1, "'batch' on some inputs only (R9)"),
        ("primary_runtime", m["primary_runtime"] in models, f"{m['primary_runtime']!r} has no model in models"),
        ("buckets", set(buckets) <= set(models), "names a runtime that has no model"),
        ("buckets.executorch", lengths == sorted(set(lengths)), "not shortest first"),
        ("buckets.executorch", not lengths or lengths[-1] == T, f"the last bucket must be max_len {T}"),
        ("buckets.executorch", len(set(methods)) == len(methods), "method names must differ (R11)"),
        ("decoding.oos_id", dec["oos_id"] <= n_int, f"above the {n_int} intents"),
        ("decoding.oos_answer", dec["oos_id"] < n_int or dec["oos_answer"] == "oos",
         f"{_short(dec['oos_answer'])}: with oos_id {n_int} (the reserved id) it must be 'oos' (R13)"),
        ("inputs", shapes == want, f"shapes {_short(shapes, 120)}, expected {want} (R9)"),
        ("seq_axis", m.get("seq_axis") != "dynamic" or shapes[0][0] == "batch",
         "dynamic needs a batched graph ('batch' inputs)"),
        ("outputs", m["outputs"][2:] == (SLOT_OUTPUTS[version] if m["label_sets"]["slot_tags"] else []),
         f"{' and '.join(SLOT_OUTPUTS[version])} exactly when slot_tags > 0"),
        ("cascade.score", score in m["outputs"], f"{_short(score)} is not one of the outputs {m['outputs']}"),
    ]
    for key, ok, why in facts:
        if not ok:
            raise PackageError(f"{where}: {key}: {why}")
    return m


def check_labels(labels: object, m: dict, where: str | Path = "labels.json") -> dict:
    """labels.json against labels.schema.json (intents: unique non-empty names; slot_tags: names; oos_label: one
    of the intents, or null), then against the manifest's label_sets: one line naming the field on failure."""
    if not isinstance(labels, dict):
        raise PackageError(f"{where}: expected a JSON object, got {type(labels).__name__}")
    _schema_check(labels, where, LABELS_SCHEMA_PATH, "(the labels)")
    intents, oos, dec = labels["intents"], labels.get("oos_label"), m["decoding"]
    if oos is not None and oos not in intents:
        raise PackageError(f"{where}: oos_label: {_short(oos)} is not one of the intents")
    for key in ("intents", "slot_tags"):
        if len(labels[key]) != m["label_sets"][key]:
            raise PackageError(f"{where}: {key}: {len(labels[key])} names, the manifest's label_sets.{key} says "
                               f"{m['label_sets'][key]}")
    # R13: the reserved id I exactly when the data has no out-of-scope class; else that class is the rejection
    k = dec["oos_id"]
    if (oos is None) != (k == len(intents)) or (oos is not None and not intents[k] == oos == dec["oos_answer"]):
        raise PackageError(f"{where}: oos_label: {_short(oos)} does not agree with the manifest's decoding.oos_id "
                           f"{k} and oos_answer {_short(dec['oos_answer'])} (R13)")
    known = set(intents)
    unknown = next((x for x in dec["allowed_intents"] or [] if x not in known), None)
    if unknown is not None:  # R14
        raise PackageError(f"{where}: intents: the manifest's decoding.allowed_intents names {_short(unknown)}, "
                           "which is not one of them")
    return labels


def _check_files(root: Path, m: dict, verify: bool, hold: set[str], have: dict[str, bytes]) -> dict[str, bytes]:
    """Each file the manifest lists: present, a plain file inside the folder (no link out), and every one's size as
    the manifest says, from the open file before a byte of any is read (an 8 GiB sparse file costs nothing); then
    each one's sha256 (unless not `verify`), read from that same open file. The files named in `hold` are read into
    memory once and their sha256 is always checked, on those very bytes. `have`: files already held and checked,
    kept as they are. -> every held file's {name: bytes}."""
    inside, opened, held = root.resolve(), {}, dict(have)
    try:
        for name, meta in m["files"].items():
            if name in have:
                continue
            f = root / name
            if not f.is_file():
                raise PackageError(f"{f}: listed in the manifest but missing")
            if f.resolve().parent != inside:
                raise PackageError(f"{f}: a link that leaves the package folder")
            opened[name] = fh = open(f, "rb")
            size = os.fstat(fh.fileno()).st_size
            if size != meta["bytes"]:
                raise PackageError(f"{f}: {size} bytes, the manifest says {meta['bytes']} (truncated or edited)")
        for name, fh in opened.items():
            meta = m["files"][name]
            if name in hold:
                held[name] = fh.read(meta["bytes"] + 1)  # + 1: a file that grew meanwhile shows it
                if len(held[name]) != meta["bytes"]:
                    raise PackageError(f"{root / name}: {len(held[name])} bytes read, the manifest says "
                                       f"{meta['bytes']} (changed while it was read)")
            if (name in hold or verify) and sha256(held.get(name, fh)) != meta["sha256"]:
                raise PackageError(f"{root / name}: sha256 differs from the manifest (corrupted or edited)")
    finally:
        for fh in opened.values():
            fh.close()
    return held


def _contents(root: Path, m: dict, verify: bool, hold: set[str],
              have: dict[str, bytes] | None = None) -> tuple[dict, dict[str, bytes]]:
    """The checks of Package.load past the manifest: the listed files (`_check_files`, those in `hold` read into
    memory), labels.json, the tokenizer and the models, each read from its held bytes where it has them ->
    (labels, held). have: files held already (Package.holding), read from those bytes and not again."""
    try:
        held = _check_files(root, m, verify, hold, have or {})
        name = m["labels"]
        raw = held[name] if name in held else read_bounded(root / name, LABELS_BYTES, "labels file")
        labels = check_labels(loads(raw, root / name), m, root / name)
        check_models(root, m, held)
    except JSONFileError as e:
        raise PackageError(str(e)) from None
    except OSError as e:  # a file the package lists that cannot be read (permissions, a name too long)
        raise PackageError(f"{e.filename or root}: cannot be read ({e.strerror or e})") from None
    return labels, held


Hold = Callable[[dict], Iterable[str]]  # the manifest -> the names of the listed files to hold in memory


@dataclass
class Package:
    root: Path
    manifest: dict
    labels: dict
    digest: str = ""  # sha256 of manifest.json: pins the whole package (the manifest holds every file's sha256)
    # listed files read into memory once, each checked against the manifest's size and sha256 on these very bytes:
    # what a Predictor runs from (Package.load's `hold`, Package.holding)
    held: dict[str, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, root: str | Path, verify: bool = True, digest: str | None = None,
             hold: Hold | None = None) -> "Package":
        """Read and check a package folder (docs/package-format.md#checks-on-load): the manifest (inside the folder,
        at most 1 MiB, strict JSON) against its schema, every file it points to listed and inside the folder, each
        file present with its size and sha256 as the manifest says; labels.json against its schema and label_sets;
        the tokenizer's piece count, the ONNX graph's inputs and a `.pte`'s segment table against the manifest; with
        `digest`, the manifest's own sha256. hold(manifest): the listed files to read into memory once (`held`):
        their sha256 and every check of them are computed on the bytes kept, so a file changed later reaches
        nothing that was loaded from them."""
        root = package_dir(root)
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise PackageError(f"{mpath}: missing; is {root} an edgekit package?")
        if mpath.resolve().parent != root.resolve():
            raise PackageError(f"{mpath}: a link that leaves the package folder")
        try:
            raw = read_bounded(mpath, MANIFEST_BYTES, "manifest")
            own = hashlib.sha256(raw).hexdigest()
            if digest is not None and own != digest.removeprefix("sha256:").lower():
                raise PackageError(f"{mpath}: package digest sha256:{own} is not the pinned {digest}")
            manifest = check_manifest(loads(raw, mpath), str(mpath))
        except JSONFileError as e:
            raise PackageError(str(e)) from None
        except OSError as e:
            raise PackageError(f"{e.filename or root}: cannot be read ({e.strerror or e})") from None
        labels, held = _contents(root, manifest, verify, set(hold(manifest)) if hold else set())
        return cls(root, manifest, labels, own, held)

    def holding(self, hold: Hold) -> "Package":
        """This package with the files `hold` names in memory: read now, each checked on those bytes against this
        package's manifest (size, sha256, and what Package.load checks of it). A file changed since `load` is a
        PackageError, never a different model under the same digest."""
        names = set(hold(self.manifest)) - set(self.held)
        if not names:
            return self
        labels, held = _contents(self.root, self.manifest, False, names, self.held)
        return Package(self.root, self.manifest, labels, self.digest, held)

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
    def mask_dtype(self) -> str:
        """The element type of the graph's intent_mask and reject: "int32", or "bool" in a schema 2 package."""
        return MASK_DTYPES[self.manifest["schema_version"]]

    @property
    def answerable(self) -> list[str] | None:
        """G, the intents the graph can choose (docs/package-format.md R14); None: every intent. A schema 2
        package's allowed_intents is the build's --intents list alone: the out-of-scope class comes off it here
        when the policy kept that class out of the softmax."""
        dec, oos = self.manifest["decoding"], self.labels.get("oos_label")
        g = dec["allowed_intents"]
        if self.manifest["schema_version"] == 2 and oos and dec["policy"].startswith("threshold on in-scope intents"):
            g = [x for x in g or self.labels["intents"] if x != oos]
        return g

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
        """The path of `runtime`'s model file (tools that time or profile it; a Predictor runs held bytes)."""
        models = self.manifest["models"]
        if runtime not in models:
            raise PackageError(f"{self.root}: no model for runtime {runtime!r} (has {', '.join(models)})")
        return self.root / models[runtime]
