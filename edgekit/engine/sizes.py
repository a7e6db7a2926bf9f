"""A package's bytes before any training: report.json's `package.size_bytes` (ExecuTorch's files: model.pte,
tokenizer.model, labels.json, manifest.json, manifest.schema.json) from the student's shape and the quantize
settings, so that a size budget picks a shape by arithmetic rather than by trial (issue 56).

Where model.pte's bytes go (ExecuTorch 1.4, lowered to XNNPACK; read with ExecuTorch's own deserializer):
- the program flatbuffer: each method's values and instructions (the Viterbi is unrolled, so it grows with the
  length), one method per length bucket, less what methods share;
- the constant segment, one copy for all methods, each tensor padded to 16 bytes: the word embedding (4-bit in
  groups, FP16 scales), the position rows up to max_len, the LayerNorms and token-type row (FP32), the word-start
  flags (FP32, 4 bytes a piece, read by the word pooling), the decoding graph's tables;
- XNNPACK's graphs, one blob per partition per method; XNNPACK's weights (named data), one copy for all methods:
  per Linear its weights, FP32 per-channel scales and bias (static INT8: an INT32 bias and its FP32 scales).
  Every segment and every named tensor is padded to 128 bytes.
The tensor parts are exact. The graph parts (program, blobs) are linear fits to exports of random-weight models
(examples/size_fit.py: 1-3 layers, one or two lengths, with and without slots, learned transitions, word pooling,
8-bit embeddings, a factorised table, static INT8 layers): within 350 bytes of each, and of SNIPS's trained
model.pte within 160. Weights do not change a file's size as long as no two tensors are equal: XNNPACK stores equal
tensors once, so the fit's students have every weight drawn at random (zero biases under-counted SNIPS by 32 KB).
Kept from the fit before (no case of this fit pins them): PROGRAM_EMB's 8-bit and FP32 terms and the per-position
Viterbi bytes.

What only training decides: the quantize stage's fallback ladder moves a 4-bit Linear that costs accuracy to static
INT8 (`QuantSpec.promoted`, about o * i / 2 bytes more each), then INT8 to FP32 (`keep_fp32`); the prune stage
chooses each layer's heads and FFN width (their sum is what it targets). Not modelled: a package without the quantize
stage (FP32 Linears throughout), and the intent names a manifest lists with --intents or an out-of-scope class.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass

SEGMENT, CONSTANT = 128, 16  # ExecuTorch's alignment of segments and named tensors, and of constant tensors
# Program flatbuffer, one method: base + per layer + per static INT8 encoder Linear (fitted to 0: its quantize nodes
# now run inside XNNPACK); with slots, + K + per position of the length (the unrolled Viterbi), learned transitions
# or not; less without word pooling. A second method shares some bytes with the first.
PROGRAM_BASE, PROGRAM_LAYER, PROGRAM_INT8, PROGRAM_SHARED, PROGRAM_SHARED_LAYER = 6041, 3097, 0, 1499, 2304
PROGRAM_SLOTS = {True: (4601, 1724), False: (3701, 1444)}  # transitions: (K, per position)
PROGRAM_NO_POOL, PROGRAM_RANK, PROGRAM_EMB = -1323, 121, {4: 0, 8: -16, 0: -200}
# XNNPACK's blobs of one method, padded: base by (slots, word pooling), per layer, + per layer the share of its
# Linears that are static INT8 (their quantize parameters), + a factorised embedding's projection.
DELEGATE_BASE = {(True, True): 6787, (True, False): 5204, (False, False): 4265}
DELEGATE_LAYER, DELEGATE_INT8, DELEGATE_RANK = 10540, 1142, 677
# tokenizer.model (a SentencePiece ModelProto): 4 specials and 256 byte pieces; a normal piece is 11 bytes plus its
# UTF-8 text; the trainer spec; the normalizer spec around the compiled charsmap (text without CJK or Hangul,
# lowercase or cased; each CJK or Hangul character the data reads adds a few bytes).
SP_FIXED_PIECES, SP_FIXED, SP_PIECE, SP_TRAINER, SP_NORMALIZER = 260, 4416, 11, 57, 26
CHARSMAP = {True: 39832, False: 14268}
PIECE_UTF8 = 7.44  # UTF-8 bytes a normal piece, "▁" included: SNIPS's trimmed vocabulary (9,533 pieces)
# manifest.json, SNIPS android's less its files, models and buckets entries; then per entry (±100 bytes: digits)
MANIFEST_CORE, MANIFEST_FILE, MANIFEST_RUNTIME, MANIFEST_BUCKET, MANIFEST_ONNX = 1501, 139, 37, 92, 63


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _varint(n: int) -> int:
    return max(1, math.ceil(n.bit_length() / 7))


@dataclass(frozen=True)
class StudentShape:
    """The student as the prune stage leaves it. vocab: tokenizer pieces (4 specials and 256 bytes included) =
    embedding rows; heads and ffn per layer (0: that block is gone); emb_rank: a factorised (V, r) table."""

    vocab: int
    heads: tuple[int, ...]
    ffn: tuple[int, ...]
    hidden: int = 384
    head_dim: int = 32
    emb_rank: int | None = None
    word_pool: bool = True
    token_types: bool = True

    @property
    def layers(self) -> int:
        return len(self.heads)


@dataclass(frozen=True)
class QuantSpec:
    """The [quantize] settings that set bytes. promoted: 4-bit Linears the fallback ladder moved to INT8, and
    keep_fp32 those kept FP32 (the ladder's next rung), where a caller knows or assumes them."""

    embedding_bits: int = 4
    embedding_group: int = 32
    embedding_scale_bytes: int = 2  # FP16, as QuantizedEmbedding stores them
    weight4: tuple[str, ...] = ()
    keep_fp32: tuple[str, ...] = ()
    promoted: tuple[str, ...] = ()


def linears(shape: StudentShape, n_intents: int, n_tags: int) -> list[tuple[str, int, int, bool]]:
    """(name, out, in, bias) of every Linear, named as in JointModel (the names weight4 patterns match)."""
    H, out = shape.hidden, []
    if shape.emb_rank:
        out.append(("word_proj", H, shape.emb_rank, False))
    for i, (h, f) in enumerate(zip(shape.heads, shape.ffn)):
        if h:
            out += [(f"layers.{i}.attn.{n}", h * shape.head_dim, H, True) for n in ("query", "key", "value")]
            out.append((f"layers.{i}.attn.out", H, h * shape.head_dim, True))
        if f:
            out += [(f"layers.{i}.fc1", f, H, True), (f"layers.{i}.fc2", H, f, True)]
    out.append(("intent_head", n_intents, H, True))
    return out + ([("slot_head", n_tags, H, True)] if n_tags else [])


def precision(name: str, quant: QuantSpec) -> str:
    """"fp32", "int4" or "int8", as quantize_executorch assigns them (and the ladder, where `quant` says)."""
    if any(fnmatch.fnmatch(name, p) for p in quant.keep_fp32):
        return "fp32"
    w4 = any(fnmatch.fnmatch(name, p) for p in quant.weight4) and name not in quant.promoted
    return "int4" if w4 else "int8"


def linear_tensors(o: int, i: int, bias: bool, kind: str) -> list[int]:
    """One Linear's named tensors in XNNPACK's weights, unpadded: 4-bit rows packed two values a byte, FP32
    per-channel scales; a static INT8 bias is INT32 with FP32 scales of its own; a 4-bit (dynamic) or FP32 one is
    FP32."""
    if kind == "fp32":
        return [4 * o * i] + [4 * o] * bias
    if kind == "int4":
        return [o * math.ceil(i / 2), 4 * o] + [4 * o] * bias
    return [o * i, 4 * o] + [4 * o, 4 * o] * bias


def constants(shape: StudentShape, quant: QuantSpec, max_len: int, n_intents: int, n_tags: int, pairs: int,
              transitions: bool) -> dict[str, int]:
    """The constant segment's tensors, padded, by what they are. pairs: the decoding table's (B-x, I-x) pairs in
    its widest row (the most slots one intent has, plus O's)."""
    V, H, R, P, Lt = shape.vocab, shape.hidden, n_intents + 1, pairs, 2 * pairs  # R: a row per intent, and oos
    width = shape.emb_rank or H
    group = quant.embedding_group if width % quant.embedding_group == 0 else width
    table, scales = {4: (V * width // 2, V * width // group), 8: (V * width, V), 0: (4 * V * width, 0)}[
        quant.embedding_bits]

    def pad(*sizes: int) -> int:
        return sum(_pad(s, CONSTANT) for s in sizes)

    out = {"embedding": pad(table), "embedding_scales": pad(scales * quant.embedding_scale_bytes),
           "positions": pad(4 * max_len * H), "norms": pad(*[4 * H] * (4 * shape.layers + 2 + shape.token_types)),
           # the intent mask and bias, NEG and the oos id, scalars (the file's last constant is not padded)
           "intent_decoding": pad(n_intents, 4 * n_intents, 4, 8, 4, 4, 4) + 4}
    if n_tags:  # cols, fill, pad, neg, o, prev, zero, down, up; learned: unary, start, cont, second
        tables = [8 * R * Lt, 4 * R * Lt, 4 * Lt, 4 * P, 16, 4 * Lt * Lt, 8, 8 * P, 8 * P]
        tables += [4 * R * Lt, 4 * R * P, 4 * R * Lt, 4 * Lt] if transitions else []
        out |= {"slot_decoding": pad(*tables), "word_starts": pad(4 * V) if shape.word_pool else 0}
    return out


def graph_bytes(shape: StudentShape, kinds: dict[str, str], lengths: list[int], slots: bool, transitions: bool,
                embedding_bits: int) -> dict[str, int]:
    """The fitted parts: the program flatbuffer (padded) and XNNPACK's blobs, for methods of these lengths;
    kinds: each Linear's precision."""
    L, pool, rank = shape.layers, shape.word_pool and slots, bool(shape.emb_rank)
    k, per_position = PROGRAM_SLOTS[transitions]
    int8 = [sum(kd == "int8" for n, kd in kinds.items() if n.startswith(f"layers.{i}.")) for i in range(L)]
    method = PROGRAM_BASE + PROGRAM_LAYER * L + PROGRAM_INT8 * sum(int8) + PROGRAM_EMB[embedding_bits]
    method += PROGRAM_RANK * rank + ((k + PROGRAM_NO_POOL * (not pool)) if slots else 0)
    program = sum(method + per_position * T * slots for T in lengths)
    program -= (len(lengths) - 1) * (PROGRAM_SHARED + PROGRAM_SHARED_LAYER * L)
    per_layer = [sum(n.startswith(f"layers.{i}.") for n in kinds) or 1 for i in range(L)]
    blobs = DELEGATE_BASE[(slots, pool)] + DELEGATE_LAYER * L + DELEGATE_RANK * rank
    blobs += DELEGATE_INT8 * sum(a / b for a, b in zip(int8, per_layer))
    return {"program": _pad(program, SEGMENT), "delegate_graphs": round(len(lengths) * blobs)}


def tokenizer_bytes(vocab: int, piece_utf8: int | None = None, lowercase: bool = True,
                    charsmap: int | None = None) -> dict[str, int]:
    """tokenizer.model's fields. piece_utf8: the normal pieces' UTF-8 bytes (None: PIECE_UTF8 a piece); charsmap:
    the compiled normalizer's bytes (None: text without CJK or Hangul)."""
    n = vocab - SP_FIXED_PIECES
    utf8 = round(PIECE_UTF8 * n) if piece_utf8 is None else piece_utf8
    cmap = CHARSMAP[lowercase] if charsmap is None else charsmap
    spec = SP_NORMALIZER + 1 + _varint(cmap) + cmap
    return {"pieces": SP_FIXED + SP_PIECE * n + utf8, "trainer": SP_TRAINER + _varint(vocab),
            "normalizer": 1 + _varint(spec) + spec}


def package_bytes(shape: StudentShape, quant: QuantSpec, labels: dict, max_len: int, buckets: tuple[int, ...] = (),
                  intent_slots: dict[str, set] | None = None, transitions: bool = True,
                  runtimes: tuple[str, ...] = ("executorch", "onnx"), **tokenizer) -> dict:
    """Predicted bytes of an ExecuTorch package: {"size_bytes", "files": {name: bytes}, "model.pte": {part: bytes},
    "tokenizer.model": {field: bytes}, "linears": {name: (precision, bytes)}}.

    labels: labels.json's dict (intents, slot_tags, oos_label); buckets: package.buckets' lengths below max_len;
    intent_slots: the slot names seen with each intent (None: every slot with every intent); transitions: the
    decoding's learned transition scores; runtimes: the profile's (the manifest lists every model file);
    tokenizer: tokenizer_bytes' piece_utf8, lowercase, charsmap."""
    from edgekit.runtime.package import SCHEMA_PATH

    n_int, tags = len(labels["intents"]), labels["slot_tags"]
    names = {t[2:] for t in tags if t[:2] in ("B-", "I-")}
    widest = max(map(len, intent_slots.values()), default=0) if intent_slots is not None else len(names)
    pte = {f"const.{k}": v for k, v in constants(shape, quant, max_len, n_int, len(tags), 1 + widest,
                                                 transitions).items()}
    pte["const.padding"] = _pad(sum(pte.values()), SEGMENT) - sum(pte.values())
    per = {}
    for name, o, i, bias in linears(shape, n_int, len(tags)):
        kind = precision(name, quant)
        tensors = linear_tensors(o, i, bias, kind)
        per[name] = (kind, sum(_pad(b, SEGMENT) for b in tensors))
        pte[f"linears_{kind}"] = pte.get(f"linears_{kind}", 0) + per[name][1]
    pte["file_end"] = tensors[-1] - _pad(tensors[-1], SEGMENT)  # the last head's last tensor ends the file unpadded
    lengths = sorted({*buckets, max_len})
    pte |= graph_bytes(shape, {n: kd for n, (kd, _) in per.items()}, lengths, bool(tags), transitions,
                       quant.embedding_bits)
    tok = tokenizer_bytes(shape.vocab, **tokenizer)
    manifest = (MANIFEST_CORE + MANIFEST_FILE * (3 + len(runtimes)) + MANIFEST_RUNTIME * len(runtimes)
                + MANIFEST_BUCKET * len(lengths) * (len(lengths) > 1) + MANIFEST_ONNX * ("onnx" in runtimes))
    files = {"model.pte": sum(pte.values()), "tokenizer.model": sum(tok.values()),
             "labels.json": len((json.dumps(labels, indent=2, ensure_ascii=False) + "\n").encode()),
             "manifest.json": manifest, "manifest.schema.json": SCHEMA_PATH.stat().st_size}
    return {"size_bytes": sum(files.values()), "files": files, "model.pte": pte, "tokenizer.model": tok,
            "linears": per}
