"""Talk to a real vLLM OpenAI server started by the tests, the demo or a bench: wait until it serves, ask for a
completion. Stdlib only (urllib): it runs in nodewarm's environment, the server in the serving one."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable


class NotServing(RuntimeError):
    pass


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(base_url: str, *, timeout: float, alive: Callable[[], bool] = lambda: True,
               log_tail: Callable[[], str] = lambda: "") -> float:
    """Block until ``GET /health`` answers 200; return the seconds waited. ``alive`` is asked between tries, so a
    server that died is reported at once with the end of its log instead of after the whole timeout."""
    t0 = time.monotonic()
    while True:
        try:
            if _get(f"{base_url}/health", timeout=3)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        if not alive():
            raise NotServing(f"vLLM at {base_url} exited before serving; its log ends:\n{log_tail()[-4000:]}")
        if time.monotonic() - t0 > timeout:
            raise NotServing(f"vLLM at {base_url} not serving after {timeout:.0f}s; its log ends:\n"
                             f"{log_tail()[-4000:]}")
        time.sleep(0.5)


def complete(base_url: str, model: str, prompt: str = "The node is", max_tokens: int = 8,
             timeout: float = 120) -> dict:
    """``POST /v1/completions`` (greedy, so the answer is reproducible); returns the response document."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        doc = json.loads(r.read())
    if not doc.get("choices"):
        raise NotServing(f"completion from {base_url} has no choices: {doc}")
    return doc


def metrics(base_url: str) -> dict[str, float]:
    """The server's Prometheus ``/metrics`` as {sample name with labels: value} (the engine's own counters)."""
    status, body = _get(f"{base_url}/metrics")
    if status != 200:
        raise NotServing(f"GET {base_url}/metrics: HTTP {status}")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out
