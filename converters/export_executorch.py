"""Export a joint model to a fixed-shape ExecuTorch program (.pte) lowered to XNNPACK, then check it.

One straight flow, as in ExecuTorch's aot_compiler: torch.export -> to_edge_transform_and_lower
(XnnpackPartitioner) -> to_executorch -> run the bytes in ExecuTorch's runtime (edgekit.runtime.backends) against eager.

Length buckets: the same model is exported at a few fixed lengths as methods of one program ("forward" at the
full length, "forward_16" at 16, ...). ExecuTorch stores a constant once however many methods use it, so a
bucket costs its graph and delegate headers (SNIPS INT8: +75 kB), not another copy of the weights.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgekit.io import write_bytes
from edgekit.record import PassRecord


@dataclass
class ExecuTorchExportConfig:
    max_len: int  # fixed sequence length of the exported program ("forward")
    buckets: tuple[int, ...] = ()  # shorter fixed lengths, each a method "forward_<length>" of the same program

    def __post_init__(self):
        if not 2 < self.max_len <= 512:
            raise ValueError(f"max_len must be in 3..512, got {self.max_len}")
        self.buckets = tuple(sorted(set(self.buckets)))
        bad = [b for b in self.buckets if not 2 < b < self.max_len]
        if bad:
            raise ValueError(f"length bucket {bad[0]} must be in 3..{self.max_len - 1} (below max_len)")

    def methods(self) -> list[dict]:
        """The manifest's buckets, shortest first: [{"max_len", "method"}]."""
        return [{"max_len": b, "method": f"forward_{b}"} for b in self.buckets] + \
            [{"max_len": self.max_len, "method": "forward"}]


def _in_submodule(node, name: str) -> bool:
    """The node comes from submodule `name` of the exported module (torch.export's nn_module_stack)."""
    stack = node.meta.get("nn_module_stack") or {}
    return any(str(path).split(".")[0] == name for path, _ in stack.values())


def partitioner(encoder_only: bool):
    """XNNPACK partitioner. encoder_only (decoded graphs): delegate only partitions holding some of the encoder;
    the decoding graph's tiny per-step adds would otherwise become one delegate call each, and a delegate call
    costs more than the portable kernel on a (1, S, S) tensor."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class EncoderXnnpackPartitioner(XnnpackPartitioner):
        # Filtered before the groups are merged into partitions: a decoding op left in a group (the softmax)
        # would join the slot head into a partition of its own after the portable intent ops, one more
        # delegate call than the graph without decoding.
        def get_matched_nodes_from_configs(self, ep):
            return [g for g in super().get_matched_nodes_from_configs(ep) if any(_in_submodule(n, "model") for n in g)]

    return EncoderXnnpackPartitioner() if encoder_only else XnnpackPartitioner()


# Ops that move or shape data (or build constants) rather than compute: left out of the delegated share.
MOVEMENT = {"view_copy", "expand_copy", "unsqueeze_copy", "squeeze_copy", "select_copy", "slice_copy", "clone",
            "permute_copy", "_to_dim_order_copy", "_clone_dim_order", "arange", "full", "full_like", "getitem",
            "split_with_sizes_copy", "cat", "alloc", "scalar_tensor"}


def delegated_share(edge_program) -> dict:
    """Share of compute ops (data movement left out) that run inside XNNPACK delegates."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge_program.exported_program().graph_module)
    inside = outside = 0
    for op, b in info.delegation_by_operator.items():
        name = re.sub(r"^(aten_|dim_order_ops_|quantized_decomposed_)", "", op)  # e.g. aten_view_copy_default
        if any(name.startswith(m) for m in MOVEMENT):
            continue
        inside, outside = inside + b.delegated, outside + b.non_delegated
    return {"delegated_compute_ops": inside, "portable_compute_ops": outside,
            "delegated_share": inside / max(1, inside + outside)}


def delegation(edge_program) -> dict:
    """Count compute ops left outside XNNPACK delegates in a lowered edge program."""
    ops = Counter()
    delegated = 0
    for node in edge_program.exported_program().graph.nodes:
        if node.op != "call_function":
            continue
        name = str(node.target)
        m = re.search(r"EdgeOpOverload: ([\w.]+)>", name)
        name = m.group(1) if m else name
        if "executorch_call_delegate" in name:
            delegated += 1
        elif "getitem" not in name:
            ops[name] += 1
    return {"delegate_calls": delegated, "undelegated_ops": dict(ops)}


def export_executorch(model: torch.nn.Module, cfg: ExecuTorchExportConfig, path: str | Path,
                      check_inputs: list[list[np.ndarray]]) -> PassRecord:
    """Write `path` (.pte) and verify it with the ExecuTorch runtime on `check_inputs` (each the graph's input
    list at full length; the first is also the example that fixes the shapes). Each bucket's method is checked
    on the inputs that fit it."""
    from executorch.exir import to_edge_transform_and_lower

    from edgekit.converters.parity import compare, low_agreement, merge
    from edgekit.runtime.backends import ExecuTorchBackend, fit

    t0 = time.perf_counter()
    model = model.eval()
    if hasattr(model, "for_runtime"):  # a decoding graph: the variant ExecuTorch runs fastest
        model = model.for_runtime("executorch")
    if check_inputs[0][0].shape[-1] != cfg.max_len:
        raise ValueError(f"check inputs have length {check_inputs[0][0].shape[-1]}, the export {cfg.max_len}")
    methods = cfg.methods()
    with torch.no_grad():
        exported = {m["method"]: torch.export.export(model, tuple(torch.from_numpy(a) for a in
                                                                  fit(check_inputs[0], m["max_len"])), strict=False)
                    for m in methods}
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner(getattr(model, "decoding", False))])
    info = {**delegation(edge), **delegated_share(edge)}  # of "forward"; the other methods are the same graph
    program = edge.to_executorch()
    write_bytes(path, program.buffer)
    per_bucket, first = {}, None
    for m in methods:
        backend = ExecuTorchBackend(path, m["method"], first)
        first = first or backend
        fits = [fit(x, m["max_len"]) for x in check_inputs if int(x[1].sum()) <= m["max_len"]]
        if fits:
            per_bucket[m["max_len"]] = compare(model, backend.run, fits)
    parity = merge(per_bucket)
    unchecked = [m["max_len"] for m in methods if m["max_len"] not in per_bucket]
    rec = PassRecord("export_executorch", bytes_after=Path(path).stat().st_size, seconds=time.perf_counter() - t0,
                     extra={"parity": parity, "max_len": cfg.max_len, "buckets": methods, **info})
    if unchecked:
        rec.warnings.append(f"length buckets {unchecked} not checked against eager: no check input fits them")
    if info["undelegated_ops"]:
        rec.warnings.append(f"ops outside XNNPACK: {info['undelegated_ops']}")
    if warning := low_agreement("ExecuTorch", parity):
        rec.warnings.append(warning)
    return rec
