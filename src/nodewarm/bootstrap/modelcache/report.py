"""What this node reports about the models it holds (names.MODELS_ANNOTATION on its Node, api.models.HeldModel):
kept in one place, written only when it changed. The controller alone turns the report into the models' labels
(controller/modellabels); the model set (modelset.py) and the Follower (follow.py) both write to it.
"""

from __future__ import annotations

import threading

from nodewarm import logs
from nodewarm.api import models as api_models
from nodewarm.api.models import HeldModel
from nodewarm.api.names import MODELS_ANNOTATION

# The model set's logger: the report's failures are told where the rest of the further models' story is.
log = logs.get("bootstrap.models")


class Book:
    """What this node reports about its models (names.MODELS_ANNOTATION): kept here, written when it changed."""

    def __init__(self, write):
        self._write = write          # annotations -> None (nodestatus.report_progress with the agent's identity)
        self._lock = threading.Lock()
        self._models: dict[str, HeldModel] = {}
        self._sent: str | None = None

    def get(self, name: str) -> HeldModel | None:
        with self._lock:
            return self._models.get(name)

    def all(self) -> tuple[HeldModel, ...]:
        with self._lock:
            return tuple(self._models.values())

    def put(self, m: HeldModel) -> None:
        with self._lock:
            self._models[m.name] = m

    def drop(self, name: str) -> None:
        with self._lock:
            self._models.pop(name, None)

    def annotation(self) -> str:
        with self._lock:
            return api_models.encode(sorted(self._models.values(), key=lambda m: m.name))

    def publish(self) -> bool:
        """Write the report if it changed since the last write; whether it wrote. A failed write is logged and
        tried again at the next change or round."""
        text = self.annotation()
        if text == self._sent:
            return False
        try:
            self._write({MODELS_ANNOTATION: text})
        except Exception as e:  # noqa: BLE001 - the report is retried; the models on disk are what they are
            log.warning("models.report_failed", error=f"{type(e).__name__}: {str(e)[:200]}")
            return False
        self._sent = text
        return True
