"""The element types of a package's graphs, against the one table every phone and web binding shares.

Schemas 3 and 4 allow int64, int32 and float32 for every input and output of both model files: each is a type that
ExecuTorch's Kotlin/Java and Swift `Tensor` APIs and ONNX Runtime's Java, Objective-C, JavaScript and C APIs
create and read directly (docs/package-format.md, "Element types"; docs/mobile.md has the binding calls). bool is
not: ExecuTorch's Java `Tensor` has no bool factory and ONNX Runtime's Objective-C `ORTTensorElementDataType` no
bool case, so a schema 2 graph (bool masks) needs native code on a phone.

The package stage checks each graph it ships against the table; `graph_types` reads what a file declares (ONNX:
edgekit.runtime.protofile, no ONNX Runtime session; ExecuTorch: the program's method metadata).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.runtime.package import PackageError
from edgekit.runtime.protofile import ONNX_DTYPES, onnx_inputs, onnx_outputs
from edgekit.runtime.tokenizer import Encoding

# name -> the code each format writes for it (ONNX TensorProto.DataType, as protofile reads it; ExecuTorch ScalarType)
ELEMENT_TYPES = {name: {"onnx": ONNX_DTYPES[name], "executorch": code}
                 for name, code in {"int64": 4, "int32": 3, "float32": 6}.items()}
OTHER_NAMES = {"onnx": {9: "bool", 2: "uint8", 3: "int8", 10: "float16", 11: "float64"},
               "executorch": {11: "bool", 0: "uint8", 1: "int8", 5: "float16", 7: "float64"}}


def _name(code: int | None, fmt: str) -> str:
    for name, codes in ELEMENT_TYPES.items():
        if codes[fmt] == code:
            return name
    return OTHER_NAMES[fmt].get(code, f"type {code}")


def graph_types(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """{graph: {"inputs": [element type, ...], "outputs": [...]}} of a model file: ONNX has one graph ("main"), a
    `.pte` one per method (length buckets)."""
    path = Path(path)
    if path.suffix == ".onnx":
        return {"main": {"inputs": [_name(t, "onnx") for _, t, _ in onnx_inputs(path)],
                         "outputs": [_name(t, "onnx") for _, t, _ in onnx_outputs(path)]}}
    from edgekit.runtime.backends import load_program

    try:
        loaded = load_program(path)  # (program, bytes): the bytes stay alive while the program is read
    except (RuntimeError, ValueError) as e:
        raise PackageError(f"{path.name}: ExecuTorch cannot load it ({str(e).strip()[:200]})") from None
    program, out = loaded[0], {}
    for method in sorted(program.get_method_name(i) for i in range(program.num_methods())):
        meta = program.method_meta(method)
        out[method] = {"inputs": [_name(meta.input_tensor_meta(i).dtype(), "executorch")
                                  for i in range(meta.num_inputs())],
                       "outputs": [_name(meta.output_tensor_meta(i).dtype(), "executorch")
                                   for i in range(meta.num_outputs())]}
    return out


def check_element_types(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """graph_types(path), or PackageError naming the first input or output whose type is not in ELEMENT_TYPES."""
    types = graph_types(path)
    for graph, sides in types.items():
        for side, names in sides.items():
            for i, name in enumerate(names):
                if name not in ELEMENT_TYPES:
                    raise PackageError(f"{Path(path).name}: {graph} {side[:-1]} {i} is {name}; a graph's element "
                                       f"types are {', '.join(ELEMENT_TYPES)} (docs/package-format.md)")
    return types


def model_inputs(enc: Encoding, n_intents: int, decoding: bool, intent_mask: np.ndarray | None = None,
                 reject: bool = True, batched: bool = False, mask_dtype=np.int32) -> list[np.ndarray]:
    """The graph's inputs for one utterance, in the manifest's order. A batched graph (server profiles) takes
    intent_mask per utterance, (B, I), where a phone's graph takes one (I,). mask_dtype: the masks' element type,
    int32 (schema 3) or bool (a schema 2 package)."""
    ids = np.asarray([enc.input_ids], dtype=np.int64)  # (1, T)
    mask = np.asarray([enc.attention_mask], dtype=np.int64)  # (1, T)
    if not decoding:
        return [ids, mask]
    allowed = (np.ones(n_intents, dtype=mask_dtype) if intent_mask is None
               else np.asarray(intent_mask, dtype=bool).astype(mask_dtype))  # (I,): 1 allowed, 0 not
    return [ids, mask, word_positions(enc.word_index).reshape(1, -1), allowed[None] if batched else allowed,
            np.asarray([reject], dtype=mask_dtype)]


def stack(inputs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Single-utterance inputs of a batched graph -> one batch (each array concatenated on its batch axis)."""
    return [np.concatenate(arrays, 0) for arrays in zip(*inputs)]


def row(outputs: list[np.ndarray], i: int) -> list[np.ndarray]:
    """Utterance i's outputs of a batched run, shaped as a single run's."""
    return [o[i : i + 1] for o in outputs]


def word_positions(word_index: list[int]) -> np.ndarray:
    """(T - 2,) int64: the position of each word's first piece, 0 past the last word ([CLS] and [SEP] leave at
    most T - 2 words). The decoding graph reads each word's slot scores there."""
    pos = np.zeros(len(word_index) - 2, dtype=np.int64)
    starts = [t for t, w in enumerate(word_index) if w >= 0][: len(pos)]
    pos[: len(starts)] = starts
    return pos
