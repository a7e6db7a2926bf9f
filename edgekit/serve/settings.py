"""How `edgekit serve` runs a package: the profile's [serve] table (`ServeSettings`, copied into the manifest), the
proxies Serve can put in front of it, and `replicas = 0` made a count. A leaf: no Ray, nothing of edgekit.serve.app
or edgekit.serve.ray_env (edgekit.engine.config reads these settings while it validates a profile)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from edgekit.runtime.providers import DEFAULT_MAX_BATCH, PROVIDERS

PROXIES = ("haproxy", "python")  # Serve's HAProxy ingress, its Python proxy actor (edgekit.serve.ray_env)


@dataclass
class ServeSettings:
    """How `edgekit serve` runs a package: the profile's [serve] table, copied into the manifest."""

    providers: list[str] = field(default_factory=lambda: ["cpu"])  # tried in order (edgekit.runtime.providers)
    max_batch: int = DEFAULT_MAX_BATCH  # @serve.batch max_batch_size, and the most texts one /predict_batch may send
    batch_wait_ms: float = 5.0  # how long a batch waits to fill
    max_ongoing_requests: int = 256  # per replica: well above max_batch, or batches stay small (Ray's default 5)
    replicas: int = 1  # fixed replica count when autoscale is false; 0: one per `threads` CPUs of the Ray cluster
    autoscale: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: int = 64  # autoscaling: requests in flight per replica it aims for
    num_gpus: float = 0.0  # per replica (a fraction shares a card); ORT's gpu_mem_limit follows it
    gpu_memory_gb: float = 24.0  # the card's memory: gpu_mem_limit = num_gpus * gpu_memory_gb
    threads: int = 1  # ONNX Runtime intra-op threads per replica (and the CPUs Ray reserves for it)
    spin: bool = False  # those threads spin-wait between calls: on cores shared with the proxy that costs throughput
    max_text_chars: int = 2000  # longer texts are refused (413)
    timeout_s: float = 10.0  # a request that waits longer is answered 503
    proxy: str = "haproxy"  # Serve's HAProxy ingress or its Python proxy ("python"); a local Ray only (ray_env)
    # 0: one model call a batch. N: the batch sorted by length, in calls of at most N: on a dynamic sequence axis each
    # call is padded to its longest utterance only (SNIPS, 2 CPU cores: 32 in two calls of 16 gave the model +20%
    # utterances/s, the served `high` load +16%)
    sub_batch: int = 0
    # Ray Serve's access log: a line per request in each replica's log file (Ray's session folder, which edgekit serve
    # never shows). Off, 2 cores under `high`: +7% with no model, +3% one at a time, +2% batched (within noise)
    # (docs/experiments.md, 2026-12-05); edgekit's own /metrics counts every request either way
    access_log: bool = False

    def __post_init__(self):
        if self.proxy not in PROXIES:
            raise ValueError(f"proxy must be one of {', '.join(PROXIES)}, got {self.proxy!r}")

        bad = [p for p in self.providers if p not in PROVIDERS]
        if bad or not self.providers:
            raise ValueError(f"providers must be some of {', '.join(PROVIDERS)}, got {self.providers}")
        for name in ("max_batch", "max_ongoing_requests", "min_replicas", "max_replicas",
                     "target_ongoing_requests", "threads", "max_text_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_ongoing_requests < self.max_batch:
            raise ValueError(f"max_ongoing_requests must be >= max_batch ({self.max_batch}), got "
                             f"{self.max_ongoing_requests}: fewer would cap every batch")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas must be >= min_replicas ({self.min_replicas}), got {self.max_replicas}")
        for name in ("replicas", "batch_wait_ms", "num_gpus", "gpu_memory_gb", "timeout_s", "sub_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def replica_count(settings: ServeSettings, cpus: float, gpus: float = 0.0) -> ServeSettings:
    """`replicas = 0` made a count: one replica per `threads` of the cluster's free `cpus` (and no more than its
    `gpus` hold at `num_gpus` each), at least one. On a CPU, replicas of one thread each answered more than one
    replica of every thread (docs/experiments.md, 2026-12-04: each has its own event loop, and one ONNX Runtime
    thread needs no waking); a fixed count or autoscaling stays as it is."""
    if settings.replicas or settings.autoscale:
        return settings
    n = int(cpus) // settings.threads
    if settings.num_gpus:
        n = min(n, int(gpus / settings.num_gpus + 1e-6))  # 0.3 / 0.1 is 2.9999999999999996
    return replace(settings, replicas=max(1, n))
