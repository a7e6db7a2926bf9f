import itertools

import numpy as np
import pytest
import torch

from edgekit.converters.decoding import (
    DecodingConfig,
    bio_tables,
    bio_transitions,
    intent_slot_table,
    viterbi,
    with_decoding,
    word_positions,
)
from edgekit.modeling.model import JointModel, ModelConfig

TAGS = ["O", "B-a", "I-a", "B-b", "I-b"]
INTENTS = ["play", "stop", "weather"]
L = 16


def brute_force(emit, pos, trans):
    """Best-scoring tag sequence over the word positions, by enumeration."""
    best, arg = None, None
    for path in itertools.product(range(emit.shape[-1]), repeat=len(pos)):
        sc, prev = 0.0, 0
        for p, t in zip(pos, path):
            sc += float(trans[prev, t] + emit[p, t])
            prev = t
        if best is None or sc > best:
            best, arg = sc, path
    return list(arg)


ODD_TAGS = ["O", "B-a", "I-a", "I-c", "B-b"]  # I-c without B-c (it happens in ATIS), B-b without I-b


@pytest.mark.parametrize("backtrack", ["argmax", "table"])
@pytest.mark.parametrize("tags", [TAGS, ODD_TAGS])
@pytest.mark.parametrize("seed", range(30))
def test_viterbi_matches_brute_force(seed, tags, backtrack):
    g = torch.Generator().manual_seed(seed)
    T, S = 8, len(tags)
    emit = torch.randn(2, T, S, generator=g) * 3  # (B, T, S)
    starts = torch.zeros(2, T, dtype=torch.bool)
    positions = []
    for b in range(2):
        n_words = int(torch.randint(1, 6, (1,), generator=g))
        pos = sorted({1, *torch.randperm(T - 2, generator=g)[: n_words - 1].add(1).tolist()})
        starts[b, pos] = True
        positions.append(pos)
    got = viterbi(emit, word_positions(starts), bio_tables(tags), backtrack=backtrack).tolist()  # (B, T) word tags
    for b, pos in enumerate(positions):
        assert got[b][: len(pos)] == brute_force(emit[b], pos, bio_transitions(tags))
        assert got[b][len(pos):] == [0] * (T - len(pos))


@pytest.mark.parametrize("backtrack", ["argmax", "table"])
@pytest.mark.parametrize("seed", range(10))
def test_intent_rows_equal_a_blocking_bias_and_batching(seed, backtrack):
    """A table row keeps only its slots' pairs: the same answer as blocking the other tags' emissions, alone
    (B = 1, the exported path) or in a batch."""
    g = torch.Generator().manual_seed(seed)
    T, tags = 8, ODD_TAGS + ["B-d", "I-d"]
    allowed = [{"a"}, {"b", "c"}, set(), None]
    tables = bio_tables(tags, allowed)
    emit = torch.randn(4, T, len(tags), generator=g) * 3
    starts = torch.rand(4, T, generator=g) < 0.6
    starts[:, 0], starts[:, 1] = False, True
    pos, row = word_positions(starts), torch.tensor([0, 1, 2, 3])
    got = viterbi(emit, pos, tables, row, backtrack)
    for b, ok in enumerate(allowed):
        block = torch.tensor([0.0 if t == "O" or ok is None or t[2:] in ok else -1e4 for t in tags])
        words = starts[b].nonzero().flatten().tolist()[: T - 2]
        assert got[b, : len(words)].tolist() == reference_viterbi(emit[b] + block, words, bio_transitions(tags))
        assert torch.equal(viterbi(emit[b:b + 1], pos[b:b + 1], tables, row[b:b + 1], backtrack), got[b:b + 1])


def reference_viterbi(emit, pos, trans):
    """Textbook S x S Viterbi over the word positions, starting after an implicit O."""
    score = trans[0] + emit[pos[0]]
    back = []
    for p in pos[1:]:
        cand = score[:, None] + trans  # (S, S): from row to column
        back.append(cand.argmax(0))
        score = cand.amax(0) + emit[p]
    path = [int(score.argmax())]
    for b in reversed(back):
        path.append(int(b[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("seed", range(6))
def test_viterbi_matches_reference_on_long_inputs(seed):
    # Long enough for several pointer doublings (W up to 38) and for some words at every length.
    g = torch.Generator().manual_seed(seed)
    tags = ["O", "B-a", "I-a", "I-c", "B-b", "B-d", "I-d", "weird"]
    T = 40
    emit = torch.randn(3, T, len(tags), generator=g) * 3
    starts = torch.rand(3, T, generator=g) < 0.7
    starts[:, 0] = False
    starts[:, 1] = True
    starts[2, 1:T - 1] = True  # every position a word: the longest case
    for backtrack in ("argmax", "table"):
        got = viterbi(emit, word_positions(starts), bio_tables(tags), backtrack=backtrack).tolist()
        for b in range(3):
            pos = starts[b].nonzero().flatten().tolist()[: T - 2]
            assert got[b][: len(pos)] == reference_viterbi(emit[b], pos, bio_transitions(tags))


def test_viterbi_backtracks_the_whole_length():
    # Two slot runs that each stay possible for 32 words: the first word's tag is only right if the back-pointers
    # are followed from the very last word (back-tracking paths that coalesce early would hide a short cut).
    tags = ["O", "B-a", "I-a", "B-d", "I-d"]
    T = 40
    emit = torch.zeros(1, T, len(tags))
    emit[0, 1, 1], emit[0, 1, 3] = 5, 4.9
    emit[0, 2:34, 2], emit[0, 2:34, 4] = 5, 4.9
    emit[0, 34, 3] = 5
    emit[0, 35:39, 4] = 5
    starts = torch.zeros(1, T, dtype=torch.bool)
    starts[0, 1:T - 1] = True
    got = [tags[i] for i in viterbi(emit, word_positions(starts), bio_tables(tags))[0, : T - 2]]
    assert got == ["B-a"] + ["I-a"] * 32 + ["B-d"] + ["I-d"] * 4


def test_viterbi_output_is_valid_bio_where_argmax_is_not():
    # Emissions that argmax to "O I-a O": I-a after O is invalid.
    emit = torch.full((1, 5, 5), -5.0)
    emit[0, 1, 0] = 5
    emit[0, 2, 2] = 5
    emit[0, 2, 1] = 4
    emit[0, 3, 0] = 5
    starts = torch.tensor([[False, True, True, True, False]])
    tags = [TAGS[i] for i in viterbi(emit, word_positions(starts), bio_tables(TAGS))[0, :3]]
    assert tags == ["O", "B-a", "O"]  # I-a after O is not allowed; the next best B-a is
    for prev, cur in zip(["O"] + tags, tags):
        assert not cur.startswith("I-") or prev[2:] == cur[2:]


def test_transitions_block_only_invalid_moves():
    t = bio_transitions(TAGS)
    assert t[0, 2] < 0 and t[3, 2] < 0 and t[4, 2] < 0  # O, B-b, I-b -> I-a
    assert t[1, 2] == 0 and t[2, 2] == 0 and t[0, 1] == 0 and t[2, 3] == 0


def test_intent_slot_table():
    table = intent_slot_table(INTENTS, TAGS, {"play": {"a"}, "stop": set()}, len(INTENTS) + 1)
    assert table[0].tolist() == [0, 0, 0, -1e4, -1e4]
    assert (table[1, 1:] < 0).all() and table[1, 0] == 0  # no slots seen with "stop": only O
    assert (table[3, 1:] < 0).all()  # the reserved oos id: only O


def tiny(n_slots=len(TAGS)):
    torch.manual_seed(0)
    return JointModel(ModelConfig(vocab_size=60, hidden=16, heads=[2, 4], ffn=[32, 16], head_dim=4,
                                  n_intents=len(INTENTS), n_slots=n_slots)).eval()


def graph_inputs(n=4, mask=None, reject=True):
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        ids = rng.integers(4, 60, (1, L)).astype(np.int64)
        att = np.ones((1, L), dtype=np.int64)
        att[0, 6 + k:] = 0
        starts = torch.zeros(1, L, dtype=torch.bool)
        starts[0, [1, 2, 4, 5][: 2 + k % 3]] = True
        allowed = np.ones(len(INTENTS), bool) if mask is None else np.asarray(mask)
        out.append([ids, att, word_positions(starts).numpy(), allowed, np.asarray([reject])])
    return out


def run_eager(model, arrays):
    with torch.no_grad():
        return [o.numpy() for o in model(*(torch.from_numpy(a) for a in arrays))]


def test_intent_mask_renormalises_over_allowed_intents():
    raw = tiny()
    dm, rec = with_decoding(raw, DecodingConfig(INTENTS, TAGS))
    assert rec.extra["oos_id"] == len(INTENTS)
    for arrays in graph_inputs():
        with torch.no_grad():
            logits = raw(torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]))[0][0]
        for allowed in ([True, False, True], [False, True, False]):
            arrays[3] = np.asarray(allowed)
            intent, conf, _, _ = run_eager(dm, arrays)
            ok = torch.tensor(allowed)
            probs = torch.softmax(logits[ok], -1)
            assert allowed[intent[0]]
            assert intent[0] == torch.arange(len(INTENTS))[ok][probs.argmax()]
            assert conf[0] == pytest.approx(float(probs.max()), abs=1e-5)


def test_build_time_whitelist_and_rejection():
    dm, _ = with_decoding(tiny(), DecodingConfig(INTENTS, TAGS, allowed_intents=["stop"]))
    for arrays in graph_inputs():
        assert run_eager(dm, arrays)[0][0] == 1
    always, _ = with_decoding(tiny(), DecodingConfig(INTENTS, TAGS, threshold=1.0))  # rejects everything
    for arrays in graph_inputs():
        intent, _, tags, _ = run_eager(always, arrays)
        assert intent[0] == len(INTENTS) and (tags == 0).all()  # oos answers no slots
        arrays[4] = np.asarray([False])  # --no-reject
        assert run_eager(always, arrays)[0][0] < len(INTENTS)
    with pytest.raises(ValueError, match="unknown intent"):
        DecodingConfig(INTENTS, TAGS, allowed_intents=["dance"])


def test_slots_follow_the_intent_whitelist_and_bio():
    dm, _ = with_decoding(tiny(), DecodingConfig(INTENTS, TAGS, intent_slots={"play": {"a"}, "stop": {"b"},
                                                                              "weather": set()}))
    allowed = {0: {"a"}, 1: {"b"}, 2: set()}
    for arrays in graph_inputs(8):
        intent, _, tags, _ = run_eager(dm, arrays)
        n = int((arrays[2] > 0).sum())
        names = [TAGS[i] for i in tags[0, :n]]
        assert {t[2:] for t in names if t != "O"} <= allowed[int(intent[0])]
        for prev, cur in zip(["O"] + names, names):
            assert not cur.startswith("I-") or prev[2:] == cur[2:]


def test_each_runtime_gets_its_back_tracking_on_shared_weights():
    dm, _ = with_decoding(tiny(), DecodingConfig(INTENTS, TAGS))
    onnx_dm, et_dm = dm.for_runtime("onnx"), dm.for_runtime("executorch")
    assert (onnx_dm.backtrack, et_dm.backtrack, dm.backtrack) == ("table", "argmax", "argmax")
    assert onnx_dm.model is dm.model
    for arrays in graph_inputs(6):
        assert all(np.array_equal(a, b) for a, b in zip(run_eager(onnx_dm, arrays), run_eager(et_dm, arrays)))


@pytest.mark.parametrize("score,temperature", [("confidence", 1.0), ("confidence", 2.5), ("energy", 1.0),
                                               ("energy", 0.7)])
def test_graph_confidence_and_rejection_match_the_calibration_module(score, temperature):
    """The graph's confidence is softmax(masked logits / T)'s top probability, and it refuses exactly the
    utterances whose score (confidence or energy, as edgekit.scoring.confidence computes them) is below the threshold."""
    from edgekit.converters.decoding import NEG
    from edgekit.scoring.confidence import scores

    raw = tiny()
    arrays = graph_inputs(6)
    with torch.no_grad():
        z = np.concatenate([raw(torch.from_numpy(a[0]), torch.from_numpy(a[1]))[0].numpy() for a in arrays])
    ref = scores(z, temperature)
    tau = float(np.median(ref[score]))  # half refused
    dm, rec = with_decoding(raw, DecodingConfig(INTENTS, TAGS, threshold=tau, score=score, temperature=temperature))
    assert (rec.extra["score"], rec.extra["temperature"]) == (score, temperature)
    got = [run_eager(dm, a) for a in arrays]
    conf = np.array([g[1][0] for g in got])
    np.testing.assert_allclose(conf, ref["confidence"], rtol=1e-5)
    refused = np.array([g[0][0] == len(INTENTS) for g in got])
    assert refused.tolist() == (ref[score] < tau).tolist() and 0 < refused.sum() < len(arrays)
    # A whitelist renormalises the energy too: blocked intents sit at NEG before the logsumexp.
    arrays[0][3] = np.array([True, False, True])
    masked = scores(np.where(arrays[0][3], z[:1], NEG), temperature)
    np.testing.assert_allclose(run_eager(dm, arrays[0])[1], masked["confidence"], rtol=1e-5)


def test_decoding_config_checks_score_threshold_and_temperature():
    DecodingConfig(INTENTS, TAGS, score="energy", threshold=-3.5)  # energies may be negative
    for bad in ({"threshold": 1.5}, {"score": "entropy"}, {"temperature": 0.0}, {"score": "energy",
                                                                                   "threshold": float("inf")}):
        with pytest.raises(ValueError):
            DecodingConfig(INTENTS, TAGS, **bad)


LEARNED = {"start": [0.5, 0.2, 0.0, -0.3, 0.1], "unary": [0.3, -0.4, 0.2, 0.1, -0.2],
           "from_b": [0.0, 0.0, 0.7, 0.0, -0.5], "from_i": [0.0, 0.0, -0.6, 0.0, 0.4]}


@pytest.mark.parametrize("n_slots,transitions", [(len(TAGS), None), (len(TAGS), LEARNED), (0, None)])
def test_decoding_graph_exports_to_both_runtimes(tmp_path, n_slots, transitions):
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.converters.export_onnx import OnnxExportConfig, export_onnx

    dm, _ = with_decoding(tiny(n_slots), DecodingConfig(INTENTS, TAGS, threshold=0.4, transitions=transitions))
    checks = graph_inputs(6) + graph_inputs(2, mask=[False, True, True], reject=False)
    for rec in (export_executorch(dm, ExecuTorchExportConfig(L), tmp_path / "m.pte", checks),
                export_onnx(dm, OnnxExportConfig(L), tmp_path / "m.onnx", checks)):
        p = rec.extra["parity"]
        assert p["intent_argmax_agree"] == 1.0 and p["max_abs_diff"] < 1e-4
        assert p["slot_argmax_agree"] == (1.0 if n_slots else None)


@pytest.mark.parametrize("runtime,batched", [("executorch", False), ("onnx", False), ("onnx", True)])
def test_path_confidence_is_the_confidence_times_each_words_probability_of_its_decoded_tag(runtime, batched):
    raw = tiny()
    cfg = DecodingConfig(INTENTS, TAGS, intent_slots={"play": {"a"}, "stop": {"a", "b"}, "weather": set()})
    dm, _ = with_decoding(raw, cfg)
    dm = dm.for_runtime(runtime, batched)
    table = intent_slot_table(INTENTS, TAGS, cfg.intent_slots, len(INTENTS) + 1).numpy()  # (I + 1, S)
    seen = set()
    for arrays in graph_inputs(6) + graph_inputs(2, mask=[False, False, True]):
        if batched:
            arrays[3] = arrays[3][None]
        intent, conf, tags, path = run_eager(dm, arrays)
        with torch.no_grad():
            slot_logits = raw(torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1]))[1][0].double().numpy()
        k, words = int(intent[0]), [int(p) for p in arrays[2][0] if p > 0]  # (T, S); first pieces
        logp = 0.0
        for w, pos in enumerate(words):  # softmax over the intent's tags only, at the tag the Viterbi chose
            z = slot_logits[pos] + table[k]
            logp += z[tags[0, w]] - np.log(np.exp(z - z.max()).sum()) - z.max()
        np.testing.assert_allclose(path[0], conf[0] * np.exp(logp), rtol=1e-4)
        assert 0 < path[0] <= conf[0]
        seen.add(k)
    assert len(seen) > 1  # more than one intent's slot table was exercised


def test_path_confidence_of_a_rejection_is_its_confidence_and_a_batch_answers_as_its_rows():
    cfg = DecodingConfig(INTENTS, TAGS, intent_slots={"play": {"a"}, "stop": {"a", "b"}, "weather": set()})
    always, _ = with_decoding(tiny(), DecodingConfig(**{**cfg.__dict__, "threshold": 1.0}))  # rejects everything
    for arrays in graph_inputs(4):
        intent, conf, _, path = run_eager(always, arrays)
        assert intent[0] == len(INTENTS) and path[0] == pytest.approx(conf[0], rel=1e-6)  # oos: O only, prob. 1
    dm, _ = with_decoding(tiny(), cfg)
    batched = dm.for_runtime("onnx", batched=True)
    rows = graph_inputs(6) + graph_inputs(2, mask=[False, True, True])
    stacked = [np.concatenate([r[k] for r in rows]) if k != 3 else np.stack([r[3] for r in rows])
               for k in range(4)] + [np.concatenate([r[4] for r in rows])]
    got = run_eager(batched, stacked)  # (B,) each, tags (B, T)
    for b, r in enumerate(rows):
        want = run_eager(dm, r)
        np.testing.assert_array_equal(got[0][b:b + 1], want[0])
        np.testing.assert_array_equal(got[2][b:b + 1], want[2])
        np.testing.assert_allclose(got[3][b:b + 1], want[3], rtol=1e-5)


def crf_brute_force(emit, pos, crf, block):
    """Best path under a FactoredCRF's scores (start, unary, its S x S moves), by enumeration."""
    trans, best, arg = crf.trans().detach(), None, None
    start, unary = (crf.start + crf.start_mask).detach(), crf.unary.detach()
    for path in itertools.product(range(emit.shape[-1]), repeat=len(pos)):
        sc = float(start[path[0]])
        for k, (p, t) in enumerate(zip(pos, path)):
            sc += float(emit[p, t] + block[t] + unary[t] + (trans[path[k - 1], t] if k else 0.0))
        if best is None or sc > best:
            best, arg = sc, path
    return list(arg)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("backtrack", ["argmax", "table"])
@pytest.mark.parametrize("seed", range(8))
def test_viterbi_with_learned_transitions_matches_the_crf_it_was_fitted_as(seed, backtrack, batched):
    """The graph's Viterbi with transition scores (start, unary, the moves into I-x) finds the path the CRF of
    converters/transitions.py scores best, per intent row, alone (the phone's path) and in a batch."""
    from edgekit.converters.transitions import FactoredCRF

    g = torch.Generator().manual_seed(seed)
    T, tags = 7, ODD_TAGS + ["B-d", "I-d"]
    crf = FactoredCRF(tags)
    with torch.no_grad():
        for p in (crf.start, crf.unary, crf.from_b, crf.from_i):
            p.copy_(torch.randn(len(tags), generator=g) * 2)
    allowed = [{"a"}, {"b", "c", "d"}, None]
    tables = bio_tables(tags, allowed, transitions=crf.scores())
    emit = torch.randn(3, T, len(tags), generator=g) * 3
    starts = torch.rand(3, T, generator=g) < 0.7
    starts[:, 0], starts[:, 1], starts[:, -1] = False, True, False
    pos, row = word_positions(starts), torch.tensor([0, 1, 2])
    got = viterbi(emit, pos, tables, row, backtrack, batched=batched)
    for b, ok in enumerate(allowed):
        block = torch.tensor([0.0 if t == "O" or ok is None or t[2:] in ok else -1e4 for t in tags])
        words = starts[b].nonzero().flatten().tolist()[: T - 2]
        assert got[b, : len(words)].tolist() == crf_brute_force(emit[b], words, crf, block), b
        assert torch.equal(viterbi(emit[b:b + 1], pos[b:b + 1], tables, row[b:b + 1], backtrack), got[b:b + 1])
    plain = viterbi(emit, pos, bio_tables(tags, allowed), row, backtrack, batched=batched)
    zero = {k: [0.0] * len(tags) for k in ("start", "unary", "from_b", "from_i")}
    assert torch.equal(viterbi(emit, pos, bio_tables(tags, allowed, transitions=zero), row, backtrack,
                               batched=batched), plain)  # zero scores: BIO alone
