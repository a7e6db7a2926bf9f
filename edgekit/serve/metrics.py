"""The Prometheus figures one `edgekit serve` replica keeps and answers on GET /metrics, and how a client
(`edgekit loadtest`) reads them back: parsed, merged over replicas, and differenced between two scrapes; and how
a client waits until every replica answers /healthz."""

from __future__ import annotations

import math
import re
from collections import deque

QUANTILES = (0.5, 0.9, 0.99)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SAMPLE = re.compile(r"([^\s{]+)(\{.*\})?\s+(\S+)")  # name, labels up to the last brace (values may hold spaces), value


class Metrics:
    """Prometheus counters of one replica (label `replica`): requests and errors by endpoint, batch sizes, queue
    time, latency quantiles over its last 10,000 requests, and the execution provider. Behind Serve's proxy a
    scrape of /metrics reaches one replica; with several, scrape until each replica label has been seen."""

    def __init__(self, provider: str):
        import time

        self.provider, self.started = provider, time.time()  # a client tells a replica newer than its first scrape
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.batches = [0] * (len(BATCH_BUCKETS) + 1)
        self.batch_sum = self.batch_count = 0
        self.queue_sum, self.queue_count = 0.0, 0
        self.latency: deque[float] = deque(maxlen=10_000)  # for the quantiles
        self.latency_sum, self.latency_count = 0.0, 0  # cumulative, as Prometheus counts

    def answered(self, seconds: float) -> None:
        self.latency.append(seconds)
        self.latency_sum, self.latency_count = self.latency_sum + seconds, self.latency_count + 1

    def batch(self, n: int, queued_s: list[float]) -> None:
        self.batches[next((k for k, b in enumerate(BATCH_BUCKETS) if n <= b), len(BATCH_BUCKETS))] += 1
        self.batch_sum, self.batch_count = self.batch_sum + n, self.batch_count + 1
        self.queue_sum, self.queue_count = self.queue_sum + sum(queued_s), self.queue_count + len(queued_s)

    def text(self, replica: str) -> str:
        import numpy as np

        r = f'replica="{replica}"'
        out = ["# HELP edgekit_requests_total Requests by endpoint.", "# TYPE edgekit_requests_total counter"]
        out += [f'edgekit_requests_total{{{r},endpoint="{k}"}} {v}' for k, v in sorted(self.requests.items())]
        out += ["# HELP edgekit_errors_total Requests answered 4xx or 5xx, by endpoint.",
                "# TYPE edgekit_errors_total counter"]
        out += [f'edgekit_errors_total{{{r},endpoint="{k}"}} {self.errors.get(k, 0)}' for k in sorted(self.requests)]
        out += ["# HELP edgekit_batch_size Utterances per batch the model answers (in calls of at most sub_batch).",
                "# TYPE edgekit_batch_size histogram"]
        cum = 0
        for b, n in zip([*map(str, BATCH_BUCKETS), "+Inf"], self.batches):
            cum += n
            out.append(f'edgekit_batch_size_bucket{{{r},le="{b}"}} {cum}')
        out += [f"edgekit_batch_size_sum{{{r}}} {self.batch_sum}",
                f"edgekit_batch_size_count{{{r}}} {self.batch_count}",
                "# HELP edgekit_queue_seconds Time a request waited on its replica for its batch to start.",
                "# TYPE edgekit_queue_seconds summary",
                f"edgekit_queue_seconds_sum{{{r}}} {self.queue_sum:.6f}",
                f"edgekit_queue_seconds_count{{{r}}} {self.queue_count}",
                "# HELP edgekit_latency_seconds Request latency in the replica, last 10000 requests.",
                "# TYPE edgekit_latency_seconds summary"]
        if self.latency:
            qs = np.quantile(np.asarray(self.latency), QUANTILES)
            out += [f'edgekit_latency_seconds{{{r},quantile="{q}"}} {v:.6f}' for q, v in zip(QUANTILES, qs)]
        out += [f"edgekit_latency_seconds_sum{{{r}}} {self.latency_sum:.6f}",
                f"edgekit_latency_seconds_count{{{r}}} {self.latency_count}",
                "# HELP edgekit_provider_info The ONNX Runtime execution provider this replica runs on.",
                "# TYPE edgekit_provider_info gauge", f'edgekit_provider_info{{{r},provider="{self.provider}"}} 1',
                "# HELP edgekit_replica_start_time_seconds When this replica started, Unix time.",
                "# TYPE edgekit_replica_start_time_seconds gauge",
                f"edgekit_replica_start_time_seconds{{{r}}} {self.started:.3f}"]
        return "\n".join(out) + "\n"


def wait_for_replicas(port: int, alive, limit_s: float, host: str = "127.0.0.1", path: str = "/healthz") -> bool:
    """True once every replica of the edgekit server on `host`:`port` has answered /healthz (each answer names
    its replica and how many there are; one may still be loading when another answers), False when `alive()`
    turns false or `limit_s` passes. A new connection each time, so the proxy may pick another replica."""
    import http.client
    import json
    import time

    deadline, seen = time.monotonic() + limit_s, set()
    while alive() and time.monotonic() < deadline:
        conn, answered = http.client.HTTPConnection(host, port, timeout=5), False
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            health = json.loads(r.read()) if r.status == 200 else None
            if isinstance(health, dict):
                answered = True
                seen.add(health.get("replica"))
                if len(seen) >= int(health.get("replicas") or 1):
                    return True
        except (OSError, http.client.HTTPException, ValueError, TypeError):
            pass
        finally:
            conn.close()
        time.sleep(0.02 if answered else 0.2)  # many replicas take many tries; a server still starting, patience
    return False


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format to {series: value}, keys exactly as written ('name{le="4"}' or a plain name).
    Comments, blank and malformed lines are skipped."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not line.lstrip().startswith("#"):
            try:
                out[m[1] + (m[2] or "")] = float(m[3])  # a trailing timestamp, if any, is ignored
            except ValueError:
                continue
    return out


def _series(metrics: dict[str, float], name: str) -> list[tuple[dict[str, str], float]]:
    """Every series of metric `name` with its labels parsed; NaN and infinite samples count nothing, so skipped."""
    return [(dict(_LABEL.findall(key.partition("{")[2])), v) for key, v in metrics.items()
            if key.partition("{")[0] == name and math.isfinite(v)]


def _total(metrics: dict[str, float], name: str) -> float | None:
    """The sum over all series of `name`, None if absent."""
    found = _series(metrics, name)
    return sum(v for _, v in found) if found else None


def _buckets(metrics: dict[str, float]) -> dict[float, float]:
    """Cumulative batch-size buckets by upper bound."""
    out: dict[float, float] = {}
    for labels, value in _series(metrics, "edgekit_batch_size_bucket"):
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            continue  # not a bucket this summary can place
        out[le] = out.get(le, 0.0) + value
    return out


def by_replica(metrics: dict[str, float] | None) -> dict[str, dict[str, float]]:
    """A (merged) scrape split by its `replica` label ("" for series without one)."""
    out: dict[str, dict[str, float]] = {}
    for key, v in (metrics or {}).items():
        out.setdefault(dict(_LABEL.findall(key.partition("{")[2])).get("replica", ""), {})[key] = v
    return out


def replicas_in(metrics: dict[str, float] | None) -> set[str]:
    """The replica labels a (merged) scrape holds."""
    return set(by_replica(metrics)) - {""}


def scrape_all(get, replicas: int) -> dict[str, float] | None:
    """Scrapes of /metrics merged until `replicas` replica labels were seen (each replica writes its own series,
    labelled, so they merge without clashing). A proxy may pick a replica at random: N (ln N + 6) tries miss one
    with a chance of about e^-6. Stops at the first failed scrape, and after one unlabelled scrape (a server that
    does not label its replicas). get: () -> one scrape, or None."""
    merged, seen = None, set()
    for _ in range(math.ceil(replicas * (math.log(replicas) + 6)) if replicas > 1 else 1):
        one = get()
        if one is None:
            break
        merged, new = {**(merged or {}), **one}, replicas_in(one)
        seen |= new
        if not new or len(seen) >= replicas:  # unlabelled: one scrape is all
            break
    return merged


def server_summary(before: dict[str, float] | None, after: dict[str, float] | None,
                   since: float | None = None) -> dict:
    """This run's batching from two scrapes: mean batch size, utterances batched, non-cumulative histogram, mean
    queue time. Differences are taken replica by replica. A replica the first scrape missed counts from zero when
    it started after `since` (the first scrape's Unix time; loopback, so the same clock), else it is left out: its
    counters hold what it did before the run. A replica whose counters went back (restarted) counts from zero.
    replicas_seen: the replicas in these figures."""
    summary = {"mean_batch_size": None, "batched_utterances": None, "batch_histogram": None, "mean_queue_ms": None,
               "provider": None, "replicas_seen": None}
    if after is None:
        return summary
    olds = by_replica(before)
    pairs, counted = [], 0  # (before, after) of each replica in the figures; how many carry a replica label
    for replica, new in by_replica(after).items():
        old = olds.get(replica)
        started = _total(new, "edgekit_replica_start_time_seconds")
        if old is None and replica and since is not None and started is not None and started < since:
            continue  # an older replica the first scrape did not reach
        old = old or {}
        if (_total(new, "edgekit_batch_size_count") or 0) < (_total(old, "edgekit_batch_size_count") or 0):
            old = {}  # restarted between the scrapes: its counters began again at zero
        pairs.append((old, new))
        counted += bool(replica)
    summary["replicas_seen"] = counted or None

    def delta(name):
        found = [(_total(new, name), _total(old, name) or 0.0) for old, new in pairs]
        found = [a - b for a, b in found if a is not None]
        return sum(found) if found else None

    size_sum, size_n = delta("edgekit_batch_size_sum"), delta("edgekit_batch_size_count")
    if size_sum is not None and size_n:
        summary["mean_batch_size"], summary["batched_utterances"] = round(size_sum / size_n, 3), round(size_sum)
    queue_sum, queue_n = delta("edgekit_queue_seconds_sum"), delta("edgekit_queue_seconds_count")
    if queue_sum is not None and queue_n:
        summary["mean_queue_ms"] = round(1000 * queue_sum / queue_n, 3)
    cum: dict[float, float] = {}
    for old, new in pairs:
        was = _buckets(old)
        for le, v in _buckets(new).items():
            cum[le] = cum.get(le, 0.0) + v - was.get(le, 0.0)
    if cum:
        hist, below = {}, 0.0
        for le in sorted(cum):
            label = "+Inf" if math.isinf(le) else (str(int(le)) if le.is_integer() else str(le))
            hist[label], below = max(0, round(cum[le] - below)), cum[le]
        summary["batch_histogram"] = hist
    providers = sorted({lab["provider"] for lab, v in _series(after, "edgekit_provider_info")
                        if v > 0 and "provider" in lab})
    summary["provider"] = ",".join(providers) or None
    return summary
