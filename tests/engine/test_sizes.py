"""The size model (edgekit/engine/sizes.py) against packages: SNIPS android's, pinned, and a tiny android build
with every model stage, quantize included (no module elsewhere builds one as a fixture)."""

import json

import pytest

from edgekit.engine import BuildConfig, build
from edgekit.engine.sizes import QuantSpec, StudentShape, linear_tensors, package_bytes, tokenizer_bytes
from tests.conftest import DEMO

ANDROID_W4 = ("*.fc1", "*.fc2", "*.attn.*")  # android's weight4 before its 2 MB budget (the SNIPS build below)
TINY_BUDGET = 225_000  # between the tiny package at 20% of the teacher's parameters and at half (with its reserve)

# SNIPS android (seed 0, 2026-12-07, engine.keys.LOWERING 2): the pruned student, its labels' counts, the slots per
# intent (the decoding tables' width, when the whitelist ships), max_len 24 with a 16 bucket. This build shipped no
# whitelist: model.pte 3,756,988 bytes; tokenizer.model 220,172 (9,533 normal pieces of 70,920 UTF-8 bytes, a
# 39,880-byte charsmap).
SNIPS = StudentShape(9793, (5, 4, 5, 2), (518, 432, 563, 597))
SNIPS_SLOTS = [9, 5, 7, 7, 14, 9, 2]


def snips_like_labels() -> tuple[dict, dict]:
    names = [f"slot{k}" for k in range(39)]
    tags = ["O"] + [f"{p}-{n}" for n in names for p in "BI"]
    intents = [f"intent{k}" for k in range(7)]
    return ({"intents": intents, "slot_tags": tags, "oos_label": None},
            {i: set(names[:n]) for i, n in zip(intents, SNIPS_SLOTS)})


def test_snips_model_pte_and_tokenizer_are_predicted_within_a_few_hundred_bytes():
    labels, slots = snips_like_labels()
    got = package_bytes(SNIPS, QuantSpec(weight4=ANDROID_W4), labels, 24, (16,), None)  # no whitelist shipped
    pte = got["model.pte"]
    assert abs(got["files"]["model.pte"] - 3_756_988) <= 256, got["files"]["model.pte"]  # the graph parts are fits
    assert pte["const.embedding"] == 9793 * 192 and pte["const.embedding_scales"] == 235_040  # 9793 x 12 FP16, padded
    assert all(kind == ("int8" if "head" in name else "int4") for name, (kind, _) in got["linears"].items())
    assert sum(tokenizer_bytes(9793, 70_920, True, 39_880).values()) == 220_172
    # the whitelist's tables (a row per intent, only its own slots) are smaller
    assert package_bytes(SNIPS, QuantSpec(weight4=ANDROID_W4), labels, 24, (16,), slots)["size_bytes"] < \
        got["size_bytes"] - 20_000


def test_the_fallback_ladder_moves_a_layer_by_its_int8_weights_and_bias():
    """What the size model cannot know before training: each 4-bit Linear the ladder promotes to INT8 adds its
    weights' other half and an INT32 bias with scales, and a few hundred bytes of graph (SNIPS's layers.0.fc1:
    +102,013 bytes, 2.6% of the package)."""
    labels, slots = snips_like_labels()
    base = package_bytes(SNIPS, QuantSpec(weight4=ANDROID_W4), labels, 24, (16,), slots)
    moved = package_bytes(SNIPS, QuantSpec(weight4=ANDROID_W4, promoted=("layers.0.fc1",)), labels, 24, (16,), slots)
    assert moved["linears"]["layers.0.fc1"][0] == "int8"
    named = sum(-(-b // 128) * 128 for b in linear_tensors(518, 384, True, "int8")) - \
        sum(-(-b // 128) * 128 for b in linear_tensors(518, 384, True, "int4"))
    assert named == (198_912 - 99_456) + 2_176  # INT8 weights less 4-bit ones (padded), the INT32 bias's scales
    graph = moved["model.pte"]["program"] + moved["model.pte"]["delegate_graphs"] - \
        base["model.pte"]["program"] - base["model.pte"]["delegate_graphs"]
    assert moved["size_bytes"] - base["size_bytes"] == named + graph and 0 <= graph < 1024


@pytest.fixture(scope="module")
def tiny_android(tmp_path_factory, tiny_bert):
    """The tiny BERT through android's stages (fuse aside), one epoch each: a pruned student with uneven heads and
    FFN widths, 4-bit embeddings and Linears, length buckets. Shares, layers and budget opened up for a 2-layer
    random model (android's would prune it to nothing, and its gates would only add tries)."""
    out = tmp_path_factory.mktemp("sizes")
    settings = {"teacher": {"epochs": 1, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2}, "distill": {"epochs": 1},
                "compress": {"total_share": 1.0, "param_share": 0.5, "max_param_share": 0.5, "max_total_share": 1.0,
                             "prune_layers": 0, "max_retries": 0},
                "budget": {"intent_drop_pts": 100.0, "slot_f1_drop_pts": 100.0},
                "package": {"bench_utterances": 20}, "decoding": {"compare_argmax": False},
                # the size search chooses the student's parameters under this budget (tests/engine/test_search.py),
                # with a fallback step in reserve and the embedding groups of 32 the budget was set between
                "limits": {"max_size": TINY_BUDGET}, "quantize": {"embedding_group": 32},
                "search": {"min_param_share": 0.2, "reserve_steps": 1}}
    rep = build(BuildConfig(data=str(DEMO), out=str(out), base_model=str(tiny_bert), target="android",
                            stages=["teacher", "trim_vocab", "prune", "distill", "quantize", "export", "package"],
                            settings=settings))
    return out, rep


def predict(out, rep, **tokenizer) -> dict:
    """The size model fed what the search knows before training: the shape, the settings, the labels and lengths."""
    passes = {p["name"]: p for p in rep["passes"]}
    prune, q = passes["prune"]["extra"], rep["config"]["settings"]["quantize"]
    # the tiny BERT: hidden 32, 4 heads of 8 (tests/conftest.py write_tiny_bert)
    shape = StudentShape(passes["trim_vocab"]["extra"]["vocab_after"], tuple(prune["heads"]), tuple(prune["ffn"]),
                         hidden=32, head_dim=8)
    ladder = passes["quantize"]["extra"]
    quant = QuantSpec(q["embedding_bits"], q["embedding_group"], weight4=tuple(q["weight4"]),
                      keep_fp32=tuple(f["layer"] for f in ladder["fp32_layers"]),
                      promoted=tuple(p["layer"] for p in ladder["promoted_to_8bit"]))
    dec = passes["export"]["extra"]["decoding"]  # the intent-slot whitelist and transitions: decided from data
    seen = None if dec["intent_slots"] is None else {k: set(v) for k, v in dec["intent_slots"].items()}
    lengths = rep["dataset"]["lengths"]
    labels = json.loads((out / "labels.json").read_text())
    return package_bytes(shape, quant, labels, lengths["max_len"], tuple(lengths["buckets"]), seen,
                         dec["transitions"] is not None, **tokenizer)


def test_tiny_android_package_is_predicted_within_tolerance(tiny_android):
    out, rep = tiny_android
    real, got = rep["package"]["files"], predict(out, rep)
    assert rep["dataset"]["lengths"]["buckets"]  # two methods in model.pte
    prune = next(p for p in rep["passes"] if p["name"] == "prune")["extra"]
    assert len(set(prune["heads"])) > 1 or len(set(prune["ffn"])) > 1  # uneven layers
    # model.pte: the tensors exactly, the graph parts by fits to within a few hundred bytes (exact on 2026-12-06)
    assert abs(got["files"]["model.pte"] - real["model.pte"]) <= 1024, (got["model.pte"], real)
    for f in ("labels.json", "manifest.schema.json"):
        assert got["files"][f] == real[f]
    assert abs(got["files"]["manifest.json"] - real["manifest.json"]) <= 100
    # tokenizer.model: 7.44 UTF-8 bytes a piece assumed (the demo's pieces are shorter: +0.4%)
    assert abs(got["files"]["tokenizer.model"] - real["tokenizer.model"]) <= 0.02 * real["tokenizer.model"]
    assert abs(got["size_bytes"] - rep["package"]["size_bytes"]) <= 0.01 * rep["package"]["size_bytes"]


def test_tiny_android_tokenizer_is_exact_given_its_pieces(tiny_android):
    from sentencepiece import sentencepiece_model_pb2 as pb

    out, rep = tiny_android
    m = pb.ModelProto()
    m.ParseFromString((out / "tokenizer.model").read_bytes())
    text = sum(len(p.piece.encode()) for p in m.pieces[260:])
    got = predict(out, rep, piece_utf8=text, charsmap=len(m.normalizer_spec.precompiled_charsmap))
    assert got["files"]["tokenizer.model"] == rep["package"]["files"]["tokenizer.model"]


def test_the_size_search_chose_a_shape_whose_package_meets_the_budget(tiny_android):
    """--max-size through the search (edgekit/engine/search.py): the student's parameters were chosen before
    training so the package written meets the budget; report.json says what was weighed and chosen, and
    frontier.png draws exactly that."""
    from edgekit.reporting.frontier import points

    out, rep = tiny_android
    assert rep["package"]["size_bytes"] <= TINY_BUDGET and rep["limits"]["size"]["met"] and not rep["over_budget"]
    chosen = [c for c in rep["search"]["candidates"] if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["package_bytes"] == rep["package"]["size_bytes"]
    assert abs(chosen[0]["size_bytes"] - rep["package"]["size_bytes"]) < 1_000  # predicted before training
    prune = next(p for p in rep["passes"] if p["name"] == "prune")["extra"]
    share = rep["config"]["settings"]["compress"]["param_share"]  # the search's, pinned: no back-off grows it
    assert share == rep["config"]["settings"]["compress"]["max_param_share"] < 0.5
    assert prune["target_params"] == pytest.approx(share * prune["nonembedding_before"], abs=2)
    (pt,) = points(rep)
    assert pt["chosen"] and pt["mb"] == chosen[0]["size_bytes"] / 1e6 and pt["p50_ms"] == rep["latency"][
        rep["package"]["runtime"]]["p50_ms"]
    assert rep["plots"]["frontier"] == "frontier.png" and (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
