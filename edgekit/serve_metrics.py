"""The Prometheus figures one `edgekit serve` replica keeps and answers on GET /metrics."""

from __future__ import annotations

from collections import deque

QUANTILES = (0.5, 0.9, 0.99)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Prometheus counters of one replica (label `replica`): requests and errors by endpoint, batch sizes, queue
    time, latency quantiles over its last 10,000 requests, and the execution provider. Behind Serve's proxy a
    scrape of /metrics reaches one replica; with several, scrape until each replica label has been seen."""

    def __init__(self, provider: str):
        self.provider = provider
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
        out += [f"edgekit_batch_size_sum{{{r}}} {self.batch_sum}", f"edgekit_batch_size_count{{{r}}} {self.batch_count}",
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
                "# TYPE edgekit_provider_info gauge", f'edgekit_provider_info{{{r},provider="{self.provider}"}} 1']
        return "\n".join(out) + "\n"
