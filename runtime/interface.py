"""The element types of a package's graphs, against the one table every phone and web binding shares.

Schema 3 allows int64, int32 and float32 for every input and output of both model files: each is a type that
ExecuTorch's Kotlin/Java and Swift `Tensor` APIs and ONNX Runtime's Java, Objective-C, JavaScript and C APIs
create and read directly (docs/package-format.md, "Element types"; docs/mobile.md has the binding calls). bool is
not: ExecuTorch's Java `Tensor` has no bool factory and ONNX Runtime's Objective-C `ORTTensorElementDataType` no
bool case, so a schema 2 graph (bool masks) needs native code on a phone.

The package stage checks each graph it ships against the table; `graph_types` reads what a file declares (ONNX:
edgekit.runtime.protofile, no ONNX Runtime session; ExecuTorch: the program's method metadata).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.runtime.package import PackageError
from edgekit.runtime.protofile import onnx_inputs, onnx_outputs

# name -> the code each format writes for it (ONNX TensorProto.DataType, ExecuTorch ScalarType)
ELEMENT_TYPES = {"int64": {"onnx": 7, "executorch": 4}, "int32": {"onnx": 6, "executorch": 3},
                 "float32": {"onnx": 1, "executorch": 6}}
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
        program = load_program(path)
    except (RuntimeError, ValueError) as e:
        raise PackageError(f"{path.name}: ExecuTorch cannot load it ({str(e).strip()[:200]})") from None
    out = {}
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
