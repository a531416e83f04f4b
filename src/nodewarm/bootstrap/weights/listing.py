"""What the model is in S3: list the prefix, HEAD each wanted object for its identity and checksums.

The HEADs go out as presigned requests on the pull's own transport (rangeget.py), not through botocore's
``head_object``: a model of many files needs one or two HEADs per file (the second, of part 1, for "-N"
objects), and botocore's request path cost ~2.6 ms of CPU per HEAD here against ~0.5 ms for signing the URL
and parsing the reply ourselves: for a 256-file model (512 HEADs, 4.3 GB) ~1.1 CPU-s, ~0.25 CPU-s per GB.
Credentials, region, endpoint and TLS trust stay botocore's, as for the GETs.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

from ..s3client import RetryPolicy, S3ObjectMissing, S3Uri, call_with_retries
from . import rangeget
from .manifest import RemoteObject, rel_path_for, select
from .s3pull import PullConfig

# The checksums S3 may hold for an object, strongest first (the order verify.method_for prefers them in).
CHECKSUM_ALGORITHMS = ("CRC64NVME", "CRC32C", "CRC32", "SHA256", "SHA1")


class _Heads:
    """HEADs of one listing: one persistent connection per listing thread."""

    def __init__(self, client, bucket: str, prefix: str, policy: RetryPolicy, timeouts: tuple[float, float, float]):
        self.client, self.bucket, self.prefix, self.policy, self.timeouts = client, bucket, prefix, policy, timeouts
        https = client.meta.endpoint_url.startswith("https")
        self.ssl_context = rangeget.ssl_context_for(client) if https else None
        self.local = threading.local()
        self.conns: list[rangeget.Connection] = []
        self.lock = threading.Lock()

    def _conn(self, endpoint: rangeget.Endpoint) -> rangeget.Connection:
        conn = getattr(self.local, "conn", None)
        if conn is None or conn.endpoint != endpoint:
            if conn is not None:
                conn.close()
            conn = self.local.conn = rangeget.Connection(endpoint, *self.timeouts[:2], self.ssl_context)
            with self.lock:
                self.conns.append(conn)
        return conn

    def _head(self, params: dict, headers: dict[str, str]) -> dict[str, str]:
        url = self.client.generate_presigned_url("head_object", Params={"Bucket": self.bucket, **params},
                                                 ExpiresIn=900)
        conn = self._conn(rangeget.endpoint_of(url))
        try:
            return conn.head(url, headers, self.timeouts[2])
        except BaseException:
            conn.close()
            raise

    def object(self, key: str) -> RemoteObject:
        what = f"HEAD s3://{self.bucket}/{key}"
        # x-amz-checksum-mode is signed into the URL, so it must be sent as signed.
        h = call_with_retries(lambda: self._head({"Key": key, "ChecksumMode": "ENABLED"},
                                                 {"x-amz-checksum-mode": "ENABLED"}), what, self.policy)
        algo = next((a for a in CHECKSUM_ALGORITHMS if h.get(f"x-amz-checksum-{a.lower()}")), None)
        obj = RemoteObject(
            key=key,
            rel_path=rel_path_for(key, self.prefix),
            size=int(h["content-length"]),
            etag=h.get("etag", "").strip('"'),
            version_id=h.get("x-amz-version-id"),
            checksum_algorithm=algo,
            checksum=h.get(f"x-amz-checksum-{algo.lower()}") if algo else None,
            checksum_type=h.get("x-amz-checksum-type"),
            encrypted_etag=h.get("x-amz-server-side-encryption", "").startswith("aws:kms")
            or bool(h.get("x-amz-server-side-encryption-customer-algorithm")),
        )
        if obj.parts_count:
            # Part 1's size lets us recompute "-N" ETags and composite checksums without one HEAD per part.
            params = {"Key": key, "PartNumber": 1, **({"VersionId": obj.version_id} if obj.version_id else {})}
            p1 = call_with_retries(lambda: self._head(params, {}), f"{what}?partNumber=1", self.policy)
            obj = RemoteObject(**{**obj.__dict__, "first_part_size": int(p1["content-length"])})
        return obj

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


@dataclass(frozen=True)
class Listed:
    """A key as ListObjectsV2 gives it: enough to size the pull before any HEAD."""

    key: str
    size: int
    etag: str


def list_keys(client, uri: S3Uri, policy: RetryPolicy,
              exclude: tuple[str, ...] = ()) -> tuple[list[Listed], list[str]]:
    """The wanted keys under the prefix, sorted (S3 lists in key order), and the skipped ones."""
    listed: dict[str, Listed] = {}
    token = None
    while True:
        kwargs = {"Bucket": uri.bucket, "Prefix": uri.prefix}
        if token:
            kwargs["ContinuationToken"] = token
        page = call_with_retries(lambda: client.list_objects_v2(**kwargs), f"list {uri}", policy)
        for o in page.get("Contents", []):
            listed[o["Key"]] = Listed(o["Key"], int(o.get("Size", 0)), o.get("ETag", "").strip('"'))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    wanted, skipped = select(list(listed), uri.prefix, exclude)
    if not wanted:
        raise S3ObjectMissing(f"nothing to pull under {uri} (listed {len(listed)} keys); check --uri")
    return sorted((listed[k] for k in wanted), key=lambda o: o.key), skipped


def heads(client, uri: S3Uri, keys: list[str], policy: RetryPolicy, timeouts: tuple[float, float, float],
          workers: int = 16) -> Iterator[RemoteObject]:
    """HEAD each key (VersionId and checksums are not in the listing), ``workers`` at a time; yields the
    objects in the order of ``keys`` as soon as each is known, so the pull starts after the first HEAD, not
    the last. ``timeouts``: (connect, stall, low-speed window) seconds for the HEADs' connections, as for the
    pull's (each response must arrive whole within the window).
    Closing the iterator early cancels the HEADs not yet sent."""
    h = _Heads(client, uri.bucket, uri.prefix, policy, timeouts)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys))), thread_name_prefix="s3head")
    try:
        yield from pool.map(h.object, keys)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        h.close()


def list_model(client, uri: S3Uri, policy: RetryPolicy, workers: int = 16,
               exclude: tuple[str, ...] = ()) -> tuple[list[RemoteObject], list[str]]:
    """List the prefix and HEAD every wanted object, with the pull's default timeouts. Returns (objects sorted by
    key, skipped keys)."""
    d = PullConfig()
    listed, skipped = list_keys(client, uri, policy, exclude)
    timeouts = (d.connect_timeout_s, d.stall_timeout_s, d.low_speed_time_s)
    return list(heads(client, uri, [o.key for o in listed], policy, timeouts, workers)), skipped
