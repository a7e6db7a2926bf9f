"""The out-of-scope threshold inside an exported ONNX decoding graph: found, tapped and rewritten.

The decoding graph refuses an utterance whose score is below a constant (converters/decoding.py: `score <
threshold`, one `Less` node). The export stage chooses that constant on the eager model's dev scores; a server graph
quantized after export (the fuse stage's INT8) moves the scores, so the build chooses it again on the shipped graph's
own (edgekit.engine.decoding_policy.rethreshold). This module finds the node, writes a copy of the graph whose last
output is the score the node compares, and writes a new constant into the graph.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

THRESHOLD = "edgekit_oos_threshold"  # the initializer the threshold lives in once this module has written it
SCORE = "edgekit_oos_score"  # the tapped copy's extra output: (B,), the score the threshold compares


def _value(model, name: str) -> np.ndarray | None:
    """A graph constant (initializer or Constant node output) as an array; None for a computed tensor."""
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == name and n.attribute and n.attribute[0].name == "value":
            return numpy_helper.to_array(n.attribute[0].t)
    return None


def find(model, threshold: float):
    """The `Less` node that compares the score with `threshold`: its second input is this module's initializer, or
    a one-element float constant equal to `threshold` in its own type. ValueError when there is none or more than
    one."""
    hits = []
    for n in model.graph.node:
        if n.op_type != "Less" or len(n.input) != 2:
            continue
        if n.input[1] == THRESHOLD:
            return n
        v = _value(model, n.input[1])
        if v is not None and v.size == 1 and v.dtype.kind == "f" and v.reshape(()) == np.asarray(threshold, v.dtype):
            hits.append(n)
    if len(hits) != 1:
        raise ValueError(f"the decoding graph has {len(hits)} Less nodes comparing with the threshold {threshold}")
    return hits[0]


def with_score_output(src: str | Path, dst: str | Path, threshold: float) -> None:
    """A copy of the graph at `src` whose last output, SCORE, is the score compared with `threshold`."""
    import onnx

    model = onnx.load(str(src))
    node = find(model, threshold)
    dtype = onnx.helper.np_dtype_to_tensor_dtype(_value(model, node.input[1]).dtype)  # the score's: Less takes one
    model.graph.node.append(onnx.helper.make_node("Identity", [node.input[0]], [SCORE], name=SCORE))
    model.graph.output.append(onnx.helper.make_tensor_value_info(SCORE, dtype, None))
    _save(model, dst)


def set_threshold(path: str | Path, old: float, new: float) -> None:
    """Rewrite the graph at `path` so that its `Less` node compares with `new` (an initializer of its own, so that no
    other node that shared the old constant changes)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    node = find(model, old)
    dtype = _value(model, node.input[1]).dtype  # float32, or float16 in a graph converted whole
    kept = [t for t in model.graph.initializer if t.name != THRESHOLD]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(new, dtype), THRESHOLD))
    node.input[1] = THRESHOLD
    _save(model, path)


def _save(model, path: str | Path) -> None:
    """Written whole or not at all: a temp file, then renamed."""
    import onnx

    tmp = f"{path}.tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
