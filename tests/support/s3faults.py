"""S3's side of the fault proxy (nodewarm_dev/testenv/faultproxy.py): its answers in S3's own error format. The faults on the
response body (reset, truncate, stall, trickle, corrupt) are the proxy's own."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarm_dev.testenv.faultproxy import Answer


@dataclass
class Reply(Answer):
    """An S3 error answer (``Reply(503, "SlowDown")``), as the server would send it."""

    status: int
    code: str
    message: str = "injected by faultproxy"
    headers: dict = field(default_factory=dict)

    def response(self) -> tuple[int, dict, bytes]:
        xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{self.code}</Code>'
               f"<Message>{self.message}</Message></Error>").encode()
        return self.status, {"Content-Type": "application/xml", **self.headers}, xml

