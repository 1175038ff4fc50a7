"""POSTs to an OpenAI-compatible endpoint that survive its hiccups: bounded retries with backoff.

    retry = Retry(max_tries=6, base_s=1.0, max_s=60.0, seed=0)
    body = post_json(url, {"model": ..., "messages": ...}, headers, timeout_s=120, retry=retry)

A try that fails in a way a later try may not is retried: HTTP 408, 429 and 5xx, a timeout, a
refused or reset connection. Before try k+1 (k = 1, 2, ...) the call waits
`min(max_s, base_s * 2**(k-1))` seconds times a jitter factor in (0.5, 1] drawn from
`random.Random(seed)` (one stream per `Retry`, so a run's waits are reproducible), or the
server's `Retry-After` seconds when it sends one (capped at `max_s`). When all `max_tries`
fail, or the endpoint refuses the request for good (HTTP 401, 403, 404), `EndpointDown` is
raised: a `derl_jax.outer.search.SearchStopped`, so the search stops before charging the
round and a rerun resumes from its last checkpoint. Any other HTTP error, and an answer that is
not JSON, is the endpoint answering: `BackendError`, which the searchers charge as a failed
reply. `sleep` is injectable (tests pass a fake clock).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import random
import socket
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping

from derl_jax.outer.search import SearchStopped

RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REFUSED_STATUS = frozenset({401, 403, 404})


class BackendError(RuntimeError):
    """The chat backend gave no usable reply (an HTTP error it answered with, not a chat completion)."""


class EndpointDown(SearchStopped):
    """The endpoint stayed unreachable or overloaded through every try, or refuses the request."""


@dataclasses.dataclass
class Retry:
    """How often and how patiently a request is retried (module docstring); `sleep(seconds)` waits."""

    max_tries: int = 6
    base_s: float = 1.0
    max_s: float = 60.0
    seed: int = 0
    sleep: Callable[[float], None] | None = None

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the `failures`-th failed try (1-based)."""
        if retry_after is not None and retry_after >= 0:
            return min(self.max_s, retry_after)
        ceiling = min(self.max_s, self.base_s * 2 ** (failures - 1))
        return ceiling * (1.0 - 0.5 * self._rng.random())

    def wait(self, seconds: float) -> None:
        if self.sleep is not None:
            self.sleep(seconds)
        else:
            import time

            time.sleep(seconds)


def _retry_after(err: urllib.error.HTTPError) -> float | None:
    value = err.headers.get("Retry-After") if err.headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _try(url: str, data: bytes, headers: Mapping[str, str], timeout_s: float) -> bytes:
    request = urllib.request.Request(url, data=data, headers=dict(headers), method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


def post_json(url: str, body: Any, headers: Mapping[str, str], *, timeout_s: float, retry: Retry | None = None) -> Any:
    """The JSON answer to POSTing `body` to `url`, retried as the module docstring says."""
    retry = retry or Retry()
    data = json.dumps(body).encode("utf-8")
    failures, last = 0, ""
    while True:
        retry_after = None
        try:
            raw = _try(url, data, headers, timeout_s)
            break
        except urllib.error.HTTPError as err:
            detail = err.read()[:200].decode("utf-8", "replace")
            last = f"HTTP {err.code}: {detail}"
            if err.code in REFUSED_STATUS:
                raise EndpointDown(f"{url}: {last}") from None
            if err.code not in RETRIED_STATUS:
                raise BackendError(f"{url}: {last}") from None
            retry_after = _retry_after(err)
        except (urllib.error.URLError, http.client.HTTPException, socket.timeout, OSError) as err:
            last = str(getattr(err, "reason", None) or err or type(err).__name__)
        failures += 1
        if failures >= max(1, retry.max_tries):
            raise EndpointDown(f"{url}: no answer after {failures} tries ({last})")
        retry.wait(retry.delay(failures, retry_after))
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise BackendError(f"{url}: reply is not JSON: {raw[:200]!r}") from None
