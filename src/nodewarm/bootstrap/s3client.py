"""Talking to S3: the S3 client, what each failure means, retries with backoff.

A plain botocore client (what boto3.client returns, less boto3's transfer methods) on purpose: boto3's
transfer manager switches to the CRT on p4d/p5/p6 when awscrt is installed and then drops our settings
(docs/testing.md, "The local S3 servers"); a plain client with our own threads behaves the same on a p5 as in
tests. Endpoint, credentials and region come from the standard AWS environment (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_REGION...), read by botocore. botocore's own retries are off: ours
classify errors (no retry storm on bad credentials) and back off with jitter.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import botocore.session
import urllib3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from nodewarm import logs
from nodewarm.api.errors import NodewarmError


log = logs.get("bootstrap.s3")
T = TypeVar("T")


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str  # "" or ends with "/"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class S3AccessDenied(NodewarmError):
    reason = "S3AccessDenied"


class S3ObjectMissing(NodewarmError):
    reason = "S3ObjectMissing"


class ObjectChanged(NodewarmError):
    reason = "ObjectChanged"


class S3Unavailable(NodewarmError):
    reason = "S3Unavailable"


class Cancelled(Exception):
    """Another worker failed for good; stop quietly."""


class Retryable(Exception):
    """A transient failure found by our own checks (short body, too slow)."""


_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
               "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "InvalidClientTokenId",
               "UnrecognizedClientException"}
_MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "404", "NotFound"}
_CHANGED_CODES = {"PreconditionFailed", "412"}
_RETRY_CODES = {"SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
                "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                "OperationAborted", "BadDigest", "IncompleteBody"}


def classify(exc: BaseException) -> str:
    """'auth' | 'missing' | 'changed' | 'retry' | 'fatal' for an exception from a boto3 call."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return "auth"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _AUTH_CODES or status in (401, 403):
            return "auth"
        if code in _MISSING_CODES or status == 404:
            return "missing"
        if code in _CHANGED_CODES or status == 412:
            return "changed"
        if code in _RETRY_CODES or status >= 500 or status == 429:
            return "retry"
        return "fatal"
    if isinstance(exc, (BotoCoreError, OSError, Retryable, urllib3.exceptions.HTTPError)):
        # Connection reset/refused, read timeouts, truncated bodies; urllib3's own errors come from
        # reading the body stream directly (s3pull).
        return "retry"
    return "fatal"


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    base_s: float = 0.25
    cap_s: float = 10.0

    def delay(self, attempt: int) -> float:
        # Full jitter: hundreds of nodes scaled up together must not hit S3 in lockstep.
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


def describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return f"{err.get('Code', '?')} (HTTP {status}): {err.get('Message', '')}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"


def fatal_error(kind: str, what: str, exc: BaseException) -> NodewarmError:
    if kind == "auth":
        return S3AccessDenied(f"{what}: {describe(exc)}; check the node role / AWS credentials and the bucket "
                              "policy (s3:ListBucket on the bucket, s3:GetObject on the prefix)")
    if kind == "missing":
        return S3ObjectMissing(f"{what}: {describe(exc)} (deleted or renamed while we were pulling?)")
    if kind == "changed":
        return ObjectChanged(f"{what}: the object changed while we were pulling it; run again to fetch the new version")
    return S3Unavailable(f"{what}: {describe(exc)}")


def call_with_retries(fn: Callable[[], T], what: str, policy: RetryPolicy,
                      cancelled: threading.Event | None = None) -> T:
    """Run ``fn`` until it succeeds, fails for good (auth, missing, changed) or runs out of attempts."""
    for attempt in range(policy.attempts):
        if cancelled is not None and cancelled.is_set():
            raise Cancelled()
        try:
            return fn()
        except (NodewarmError, Cancelled):
            raise
        except Exception as exc:  # noqa: BLE001 - classified right here
            kind = classify(exc)
            if kind != "retry":
                raise fatal_error(kind, what, exc) from exc
            if attempt + 1 == policy.attempts:
                raise S3Unavailable(f"{what}: gave up after {policy.attempts} attempts: {describe(exc)}") from exc
            delay = policy.delay(attempt)
            log.warning("s3.retry", what=what, attempt=attempt + 1, error=describe(exc), backoff_s=round(delay, 3))
            if cancelled is not None:
                if cancelled.wait(delay):
                    raise Cancelled()
            else:
                time.sleep(delay)
    raise AssertionError("unreachable")


_LOADER_LOCK = threading.Lock()
_LOADER: list = []     # botocore's reader of its bundled JSON, shared by this process's clients (see make_client)


def make_client(pool_size: int, connect_timeout_s: float, read_timeout_s: float,
                response_checksums: bool = True):
    """A plain S3 client from the standard AWS environment; one per pull, shared by its threads.

    Its own session, so credentials, region and endpoint are read from the environment as it is now.
    ``response_checksums=False`` is for callers that verify every byte they GET themselves: botocore
    (1.36 on, boto/boto3#4754) wraps a 5xx GET's body for checksum validation when the error carries
    an x-amz-checksum header, then its error parser fails on the wrapper with AttributeError, so a
    transient server error becomes a fatal one instead of a retry."""
    config = Config(
        max_pool_connections=pool_size,
        connect_timeout=connect_timeout_s,
        # Socket-level: a connection that sends nothing for this long is a stall, retried elsewhere.
        read_timeout=read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},
        tcp_keepalive=True,
        # The pull's ranged GETs are presigned (weights/rangeget.py): SigV4, as every region requires.
        signature_version="s3v4",
        response_checksum_validation="when_supported" if response_checksums else "when_required",
    )
    session = botocore.session.get_session()
    # botocore's reader of its bundled JSON (the S3 API model, endpoint rules), made by the first session as
    # botocore makes it (AWS_DATA_PATH included) and shared by the later ones: a new session parses those files
    # again, 0.1-0.3 s of CPU per client here. The parsed data is read-only (botocore shares it between the
    # clients of one session too). Taken from the first client's own session, not a session of its own: each
    # session costs ~0.02-0.04 s of handler registration on the agent's path to its first GET.
    with _LOADER_LOCK:
        if _LOADER:
            session.register_component("data_loader", _LOADER[0])
        else:
            _LOADER.append(session.get_component("data_loader"))
    return session.create_client("s3", config=config)
