"""The latency model (edgekit/engine/latency.py) and the search under --max-latency (edgekit/engine/search.py)."""

import pytest

from edgekit.engine.latency import LatencyModel, fit_points
from edgekit.engine.search import SearchSettings, candidates, lowest
from tests.engine.test_search import _prepare, snips_facts


def _model(a=0.3, b=0.25, c=0.4) -> LatencyModel:
    return LatencyModel(a, b, c, (), "a CPU", 1)


def test_the_fit_recovers_a_linear_cost_and_its_inverse_gives_the_parameters_back():
    true = _model()
    points = [{"layers": n, "params": p, "p50_ms": true.predict(n, p)} for n in (2, 4) for p in (500_000, 2_000_000)]
    got = fit_points(points, "a CPU", 1)
    assert (got.a, got.b, got.c) == pytest.approx((0.3, 0.25, 0.4))
    assert got.max_params(4, got.predict(4, 1_234_567)) == pytest.approx(1_234_567, abs=2)
    assert got.max_params(4, got.predict(4, 0) - 0.01) == -1  # not even an empty layer fits
    assert got.to_dict()["residual_ms"] == pytest.approx([0.0] * 4, abs=1e-9)
    one = fit_points([p for p in points if p["layers"] == 4], "a CPU", 1)  # one depth: its cost folds into a
    assert one.b == 0 and one.predict(4, 1_000_000) == pytest.approx(true.predict(4, 1_000_000))


def test_candidates_under_a_latency_budget_are_predicted_within_it():
    facts, model = snips_facts(), _model()
    cfg = SearchSettings(vocab_budgets=[0], embedding_ranks=[128], layers=[4, 3, 2], min_param_share=0.04)
    free = candidates(facts, cfg, 4_000_000, 4, param_share=0.3)
    budget = 1.6
    got = candidates(facts, cfg, 4_000_000, 4, param_share=0.3, latency=(model, budget))
    assert [c.layers for c in got] == [4, 3, 2]
    for c in got:
        assert c.p50_ms_model == pytest.approx(model.predict(c.layers, c.nonemb), abs=1e-3)
        assert c.p50_ms_model <= budget and c.size_bytes <= 4_000_000
    # fewer layers leave more of the budget to parameters; the size budget alone gives each more than the latency
    assert got[0].nonemb < got[1].nonemb < got[2].nonemb
    assert all(c.nonemb < f.nonemb for c, f in zip(got, free))
    # a budget under the fastest shape (2 layers, the fewest parameters) has no candidate
    assert not candidates(facts, cfg, None, 4, latency=(model, model.predict(2, lowest(facts, cfg)) - 0.01))


def test_prepare_fits_the_latency_model_once_per_machine_and_builds_the_fastest_shape_when_none_is_within(
        tiny_bert, tmp_path):
    """Real probes: random students exported to ExecuTorch and timed in a fresh process, before any training (one
    depth, so two probes: each export costs tens of seconds)."""
    search = {"layers": [1], "min_param_share": 0.1}

    def plan(max_latency):
        ctx = _prepare(tiny_bert, tmp_path, None, search, max_latency=max_latency,
                       compress={"param_share": 1.0, "total_share": 1.0, "max_param_share": 1.0,
                                 "max_total_share": 1.0})
        return ctx, ctx.search

    ctx, roomy = plan("1s")
    m = roomy["latency_model"]
    assert not m["cached"] and [p["layers"] for p in m["points"]] == [1, 1] and m["b"] == 0
    low, high = sorted(p["params"] for p in m["points"])
    assert low < high and all(p["p50_ms"] > 0 for p in m["points"])
    assert m["cpu"] and m["threads"] == ctx.target.bench_threads and len(m["residual_ms"]) == 2
    (chosen,) = roomy["candidates"]
    assert chosen["chosen"] and roomy["limits"]["max_latency"] == 1000
    assert high - 1_000 <= chosen["nonemb"] <= high  # nothing held it back but the profile's shares
    assert chosen["p50_ms_model"] == pytest.approx(m["a"] + m["c"] * chosen["nonemb"] / 1e6, abs=1e-3)
    _, tight = plan("0.001ms")  # the same machine and settings: the model is read back, not probed again
    t = tight["latency_model"]
    assert t["cached"] and (t["a"], t["b"], t["c"]) == (m["a"], m["b"], m["c"])
    (chosen,) = tight["candidates"]  # none is within 1 us: the fastest shape, which the package stage then holds
    fastest = min(m["a"] + m["c"] * n / 1e6 for n in (low, high))
    assert t["fastest_ms"] == pytest.approx(fastest, abs=1e-3) and chosen["chosen"]
    assert chosen["p50_ms_model"] == pytest.approx(fastest, abs=1e-3)


def test_a_negative_cost_from_noisy_timings_is_dropped_from_the_fit():
    points = [{"layers": 1, "params": 1_000, "p50_ms": 0.101}, {"layers": 1, "params": 9_000, "p50_ms": 0.100},
              {"layers": 2, "params": 1_000, "p50_ms": 0.121}, {"layers": 2, "params": 9_000, "p50_ms": 0.120}]
    m = fit_points(points, "a CPU", 1)
    assert m.c == 0 and m.b == pytest.approx(0.02) and m.max_params(1, m.predict(1, 0)) > 10**12
