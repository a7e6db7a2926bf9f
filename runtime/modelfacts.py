"""What the manifest says of a package's tokenizer and models, checked from their bytes without loading a model
(docs/package-format.md R5, R8, R9): `Package.load` and `edgekit verify` run these."""

from __future__ import annotations

from pathlib import Path

from edgekit.runtime.errors import PackageError
from edgekit.runtime.protofile import ONNX_DTYPES, onnx_inputs, onnx_outputs, sentencepiece_facts
from edgekit.runtime.ptefile import PteError, check_segments
from edgekit.runtime.schemas import short as _short

OUTPUT_DTYPES = {"intent": "int64", "confidence": "float32", "tags": "int64", "path_confidence": "float32"}  # R8


def _shape(dtype, dims) -> str:
    name = {v: k for k, v in ONNX_DTYPES.items()}.get(dtype, f"elem_type {dtype}")
    return f"{name} [{', '.join(map(str, dims))}]" if dims is not None else f"{name} with no shape"


def _fits(dim, want) -> bool:
    """A graph's dimension (int, a name, or None: unknown) takes the manifest's: "batch" needs a dynamic one, a
    number the same number or a dynamic one (e.g. a dynamic sequence axis)."""
    dynamic = not isinstance(dim, int)
    return dynamic if want == "batch" else dynamic or dim == want


# R5: each special piece's text and SentencePiece type (2 UNKNOWN, 3 CONTROL), by the manifest's special_ids key
SPECIALS = {"pad": ("<pad>", 3), "unk": ("<unk>", 2), "cls": ("[CLS]", 3), "sep": ("[SEP]", 3)}
SP_TYPES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}


def check_tokenizer(tok: Path, t: dict, data: bytes | None = None) -> None:
    """R5: the piece count is vocab_size, the normalizer the manifest's, and each special piece found by its text
    once, of its type, at the manifest's id (read from `data`, the file's bytes, when held)."""
    try:
        pieces, normalizer, found = sentencepiece_facts(tok if data is None else data,
                                                        [text for text, _ in SPECIALS.values()])
    except ValueError as e:
        raise PackageError(f"{tok}: not a SentencePiece model ({e})") from None
    if pieces != t["vocab_size"]:
        raise PackageError(f"{tok}: {pieces} pieces, the manifest's tokenizer.vocab_size says {t['vocab_size']}")
    if normalizer != t["normalizer"]:
        raise PackageError(f"{tok}: its normalizer is {_short(normalizer)}, the manifest's tokenizer.normalizer "
                           f"says {t['normalizer']!r}")
    for key, (text, kind) in SPECIALS.items():
        pieces = [(k, SP_TYPES.get(ty, ty)) for k, ty in found[text]]
        if pieces != [(t["special_ids"][key], SP_TYPES[kind])]:
            raise PackageError(f"{tok}: piece {text!r} is {_short(pieces)} (id, type), the manifest's "
                               f"tokenizer.special_ids.{key} says one {SP_TYPES[kind]} piece at id "
                               f"{t['special_ids'][key]}")


def check_models(root: Path, m: dict, held: dict[str, bytes]) -> None:
    """What the manifest says of the other files, read from them without loading a model: the tokenizer's piece
    count is tokenizer.vocab_size, and each ONNX graph declares the manifest's inputs (names, dtypes, shapes: a
    fixed dimension is the manifest's number, "batch" is a dynamic one); a `.pte`'s segment table is one its
    serializer writes (ptefile: ExecuTorch's own verification does not look). A file in `held` is read from those
    bytes."""
    check_tokenizer(root / m["tokenizer"]["file"], m["tokenizer"], held.get(m["tokenizer"]["file"]))
    if "executorch" in m["models"]:
        pte = m["models"]["executorch"]
        try:
            check_segments(held.get(pte, root / pte))
        except PteError as e:
            raise PackageError(f"{m['models']['executorch']}: {e}") from None
    graphs = [m["models"]["onnx"]] if "onnx" in m["models"] else []
    graphs += [m["tensorrt_model"]] if "tensorrt_model" in m else []
    names = [i["name"] for i in m["inputs"]]
    for f, src in ((root / name, held.get(name, root / name)) for name in graphs):
        try:
            graph = onnx_inputs(src)
        except ValueError as e:
            raise PackageError(f"{f}: not an ONNX model ({e})") from None
        if [name for name, _, _ in graph] != names:
            raise PackageError(f"{f}: the graph's inputs are {_short([n for n, _, _ in graph])}, the manifest's "
                               f"inputs say {names}")
        for k, ((name, dtype, dims), want) in enumerate(zip(graph, m["inputs"])):
            if dtype != ONNX_DTYPES[want["dtype"]] or dims is None or len(dims) != len(want["shape"]) or not all(
                    map(_fits, dims, want["shape"])):
                raise PackageError(f"{f}: input {name} is {_shape(dtype, dims)} in the graph, the manifest's "
                                   f"inputs.{k} says {want['dtype']} [{', '.join(map(str, want['shape']))}]")
        outputs = onnx_outputs(src)  # R8: the outputs the manifest names, of their types
        if [(name, dtype) for name, dtype, _ in outputs] != [(n, ONNX_DTYPES[OUTPUT_DTYPES[n]]) for n in m["outputs"]]:
            raise PackageError(f"{f}: the graph's outputs are {_short([(n, _shape(t, d)) for n, t, d in outputs], 160)}"
                               f", the manifest's outputs say {m['outputs']} "
                               f"({', '.join(f'{n} {OUTPUT_DTYPES[n]}' for n in m['outputs'])})")
