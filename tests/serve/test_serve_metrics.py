"""edgekit.serve.metrics: one replica's /metrics text, read back by a client over several replicas."""

from edgekit.serve.metrics import Metrics, parse_metrics, replicas_in, scrape_all, server_summary


def scrape(replica: str, batches: list[int]) -> dict[str, float]:
    """What replica `replica` answers on /metrics after answering batches of these sizes."""
    m = Metrics("CPUExecutionProvider")
    for n in batches:
        m.batch(n, [0.01] * n)
    return parse_metrics(m.text(replica))


def test_scrapes_merge_until_every_replica_answered():
    answers = iter([scrape("a", [1]), scrape("a", [1]), scrape("b", [2]), scrape("c", [3])])
    calls = []
    merged = scrape_all(lambda: calls.append(1) or next(answers), replicas=2)
    assert len(calls) == 3 and replicas_in(merged) == {"a", "b"}
    # a replica that never answers: N (ln N + 6) tries, then the figures say what they hold
    calls.clear()
    merged = scrape_all(lambda: calls.append(1) or scrape("a", [1]), replicas=3)
    assert len(calls) == 22 and server_summary(None, merged)["replicas_seen"] == 1
    # a failed scrape ends it (a server not answering /metrics would cost a timeout a try)
    calls.clear()
    assert scrape_all(lambda: calls.append(1) or None, replicas=4) is None and len(calls) == 1


def test_differences_are_taken_replica_by_replica():
    before = {**scrape("a", [1, 1]), **scrape("b", [2, 2])}
    # this run: a answered two batches of 4, b two of 4; the last scrape missed b
    after_a = scrape("a", [1, 1, 4, 4])
    s = server_summary(before, after_a)
    assert s["mean_batch_size"] == 4.0 and s["batched_utterances"] == 8 and s["replicas_seen"] == 1
    assert s["batch_histogram"]["4"] == 2 and s["batch_histogram"]["1"] == 0
    # the first scrape missed b: it counts from zero when it started after that scrape, else it is left out
    import time

    s = server_summary(scrape("a", [1, 1]), {**after_a, **scrape("b", [4, 4])}, since=time.time() - 60)
    assert s["mean_batch_size"] == 4.0 and s["batched_utterances"] == 16 and s["replicas_seen"] == 2
    s = server_summary(scrape("a", [1, 1]), {**after_a, **scrape("b", [2, 4, 4])}, since=time.time() + 60)
    assert s["batched_utterances"] == 8 and s["replicas_seen"] == 1  # b's history is not this run's
    # b restarted (a new process, counters from zero, the same label here): only its new batches count
    s = server_summary(before, {**after_a, **scrape("b", [4])})
    assert s["batched_utterances"] == 12 and s["batch_histogram"]["4"] == 3 and s["batch_histogram"]["2"] == 0
