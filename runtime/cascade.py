"""Device first, server when unsure: the runtime half of the cascade.

The device answers every utterance. When its score (the manifest's `cascade.score`: `path_confidence`, the whole
answer's probability, in a schema 4 package with slots; else `confidence`) is below the threshold τ (the manifest's
`cascade.threshold`, calibrated on dev by `edgekit compare`), the utterance is sent to an `edgekit serve`
server (`POST /predict`) and the server's answer is returned. The app never sees an exception from this path:
a server that is down, slow past the timeout or answers garbage gives the device answer, flagged
`"escalated": false, "fallback": "unreachable"`.

Standard library only (urllib): the runtime stands for the phone and stays light.
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.request
from dataclasses import dataclass

SCORES = ("confidence", "path_confidence")  # what a device answer may escalate on (the manifest's cascade.score)
DEFAULT_TIMEOUT_S = 0.3  # without a manifest value: a mobile round trip plus a server answer, with room


@dataclass
class Fallback:
    """Where and when to escalate. url: the server's base URL (`http://host:port`); threshold: escalate when the
    device answer's `score` (`confidence` or `path_confidence`) is below it; timeout_s: the whole call's budget,
    connect included."""

    url: str
    threshold: float
    timeout_s: float = DEFAULT_TIMEOUT_S
    score: str = "confidence"

    def __post_init__(self):
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"fallback_url must start with http:// or https://, got {self.url!r}")
        if not (math.isfinite(self.threshold) and 0 <= self.threshold <= 1):
            raise ValueError(f"escalate_below: the cascade threshold is a confidence in [0, 1], got {self.threshold}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"the fallback timeout must be > 0 seconds, got {self.timeout_s}")
        if self.score not in SCORES:
            raise ValueError(f"the cascade score must be one of {', '.join(SCORES)}, got {self.score!r}")
        self.url = self.url.rstrip("/")

    def wants(self, answer: dict) -> bool:
        return answer[self.score] < self.threshold  # a schema 2 or 3 package's score is "confidence"

    def ask(self, text: str, allow_intents: list[str] | None, reject: bool) -> dict | None:
        """The server's answer, or None when it cannot be had within the timeout (any failure)."""
        body = {"text": text, "reject": reject} | ({"allow_intents": allow_intents} if allow_intents else {})
        req = urllib.request.Request(self.url + "/predict", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        deadline = time.monotonic() + self.timeout_s
        try:
            # urllib's timeout bounds each socket operation; the deadline check bounds the whole exchange.
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                data = r.read(1 << 20)
            if time.monotonic() > deadline:
                return None
            ans = json.loads(data)
        except (OSError, http.client.HTTPException, ValueError, OverflowError):  # URLError and timeouts are OSErrors; a reply
            return None  # that is not HTTP raises HTTPException, one that is not JSON ValueError
        if not isinstance(ans, dict) or not isinstance(ans.get("intent"), str):
            return None
        return ans

    def answer(self, device: dict, text: str, allow_intents: list[str] | None, reject: bool) -> dict:
        """The cascade's answer for one utterance, given the device's."""
        if not self.wants(device):
            return device | {"escalated": False}
        server = self.ask(text, allow_intents, reject)
        if server is None:
            return device | {"escalated": False, "fallback": "unreachable"}
        return server | {"escalated": True, "device": {k: device[k] for k in ("intent", "confidence", "path_confidence")
                                                         if k in device}}
