"""Which MatMuls of a server graph INT8 breaks: the FP32 package's graph through ONNX Runtime's transformer optimizer,
then dynamic INT8 of one group of MatMuls at a time (grouped by the op that feeds them: LayerNormalization for the
Q, K, V and FFN-in projections, BiasGelu for FFN-out, Reshape for the attention output), each against the FP32
graph on the same test utterances: answers unchanged (intent and every tag; share) and the largest difference of
the answers' confidence (the package graph's float output).

    edgekit build --task intent --target server-cpu --base-model mpnet --data ../shared/data/snips --out OUT \\
        --stages teacher,trim_vocab,export,package
    python examples/int8_sensitivity.py OUT ../shared/data/snips --n 100
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path


def main(package: str, data: str, n: int) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from edgekit.converters.optimize_onnx import ServerConfig, optimize_onnx
    from edgekit.converters.parity import same_answer
    from edgekit.data.dataset import load_dataset
    from edgekit.runtime import Predictor
    from edgekit.runtime.backends import OnnxBackend
    from edgekit.runtime.package import Package

    pkg = Package.load(package)
    pred = Predictor.open(pkg, "onnx", providers=["cpu"])
    xs = [pred.inputs(pred.tokenizer.encode(ex.text, pred.max_len), reject=False)
          for ex in load_dataset(data).splits["test"][:n]]
    with tempfile.TemporaryDirectory() as d:
        fp32 = Path(d) / "fp32.onnx"
        optimize_onnx(pkg.model_path("onnx"), fp32, ServerConfig(batch=True, seq="dynamic", optimize=True), xs[:2])
        ref = OnnxBackend(fp32)
        want = [ref.run(*x) for x in xs]
        # the quantizer needs every tensor's type, which ONNX's inference cannot give for the fused com.microsoft ops
        # (without it no MatMul after a fused Attention is quantized): ONNX Runtime's symbolic inference first
        typed = Path(d) / "typed.onnx"
        onnx.save(SymbolicShapeInference.infer_shapes(onnx.load(str(fp32)), auto_merge=True), str(typed))
        graph = onnx.load(str(typed)).graph
        made_by = {o: node.op_type for node in graph.node for o in node.output}
        weights, groups = {i.name for i in graph.initializer}, defaultdict(list)
        for node in graph.node:
            if node.op_type == "MatMul" and node.input[1] in weights:  # weight MatMuls: what INT8 quantizes
                groups[made_by.get(node.input[0], "input")].append(node.name)
        everything = [m for ms in groups.values() for m in ms]
        for name, members in [("all", everything)] + sorted(groups.items()):
            out = Path(d) / f"{name}.onnx"
            quantize_dynamic(str(typed), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=[m for m in everything if m not in members])
            if not any(n.op_type == "MatMulInteger" for n in onnx.load(str(out)).graph.node):
                raise SystemExit(f"{name}: the quantizer left every MatMul FP32")
            got = OnnxBackend(out)
            checks = [same_answer(w, got.run(*x), x[1].astype(bool)) for w, x in zip(want, xs)]
            print(json.dumps({"int8_matmuls": name, "count": len(members),
                              "same_answers": round(sum(ok for ok, _ in checks) / len(checks), 3),
                              "max_confidence_diff": float(f"{max(diff for _, diff in checks):.3g}")}), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", help="an FP32 server package (server-cpu built without the fuse stage)")
    ap.add_argument("data")
    ap.add_argument("--n", type=int, default=100, help="test utterances compared")
    a = ap.parse_args()
    main(a.package, a.data, a.n)
