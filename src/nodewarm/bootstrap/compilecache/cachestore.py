"""The compile-cache bucket: object layout, and the few S3 calls publish and restore need.

Layout under ``compileCache.uri`` (see cachekey.prefix for the readable part)::

    <uri>/v2/cuda-<v>/torch-<v>+<build>/vllm-<v>/<model>@<rev>/tp<N>-pp<M>/image-<digest>/<gpu>x<count>/
        <key_id>.json                 signed envelope: the key's current bundle (its manifest has a generation);
                                      created If-None-Match: *, replaced only If-Match its ETag when stale
        <key_id>.json.claims/g<N>/<t>-<id>  claims to write generation N, only on servers without conditional writes
        <key_id>.json.stale/<N>       generation N was proven to miss in serving (or its hash dirs are outdated)
        blobs/<sha256>.tar.zst        the archive, content-addressed and never overwritten
    <uri>/runtimes/<sha256(image)[:16]>.json   the serving image's software, signed (runtimedesc)

Readers only follow an envelope to the blob it names, and a blob never changes, so a reader can
never pair a manifest with another node's archive, whatever the server does with preconditions.
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass
from pathlib import Path

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from ..localwrite import write_error
from ..s3client import RetryPolicy, S3ObjectMissing, S3Uri, call_with_retries, make_client

log = logs.get("bootstrap.compilecache")

ENVELOPE_SUFFIX = ".json"
MAX_ENVELOPE_BYTES = 1 << 20


class InvalidCacheUri(NodewarmError):
    reason = "InvalidCompileCacheUri"


def parse_uri(uri: str) -> S3Uri:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise InvalidCacheUri(f"compileCache.uri {uri!r} is not an s3://BUCKET/PREFIX URI")
    return S3Uri(bucket, prefix.strip("/") + "/" if prefix.strip("/") else "")


def envelope_key(prefix: str, key_id: str) -> str:
    return f"{prefix}{key_id}{ENVELOPE_SUFFIX}"


def runtime_key(root: str, image: str) -> str:
    """Where the serving image's runtime descriptor lives (see runtimedesc)."""
    return f"{root}runtimes/{hashlib.sha256(image.encode()).hexdigest()[:16]}{ENVELOPE_SUFFIX}"


def stale_key(env_key: str, generation: int) -> str:
    return f"{env_key}.stale/{generation}"


def blob_key(prefix: str, sha256: str) -> str:
    return f"{prefix}blobs/{sha256}.tar.zst"


@dataclass
class CacheStore:
    """One compile-cache bucket prefix. Keys passed in are full object keys."""

    uri: S3Uri
    client: object = None
    policy: RetryPolicy = RetryPolicy(attempts=5)
    _conditional: bool | None = None

    def __post_init__(self) -> None:
        if self.client is None:
            # Every byte this store GETs is checked against a signature, the signed sha256 (restore.py)
            # or the bytes we wrote (publish.py), so botocore's response checksums add nothing here and
            # bring its 5xx bug (s3client.make_client).
            self.client = make_client(pool_size=4, connect_timeout_s=5, read_timeout_s=60, response_checksums=False)

    @property
    def root(self) -> str:
        return self.uri.prefix

    def _call(self, fn, verb: str, key: str):
        return call_with_retries(fn, f"{verb} s3://{self.uri.bucket}/{key}", self.policy)

    def exists(self, key: str) -> bool:
        try:
            self._call(lambda: self.client.head_object(Bucket=self.uri.bucket, Key=key), "HEAD", key)
            return True
        except S3ObjectMissing:
            return False

    def list(self, prefix: str, delimiter: str | None = "/") -> list[str]:
        keys: list[str] = []
        token = None
        while True:
            kw = {"Bucket": self.uri.bucket, "Prefix": prefix}
            if delimiter:
                kw["Delimiter"] = delimiter
            if token:
                kw["ContinuationToken"] = token
            page = self._call(lambda kw=kw: self.client.list_objects_v2(**kw), "list", prefix)
            keys += [o["Key"] for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(keys)

    def list_dirs(self, prefix: str) -> list[str]:
        """The "folders" right under ``prefix`` (S3 CommonPrefixes), first page only: enough to name a neighbour."""
        page = self._call(lambda: self.client.list_objects_v2(Bucket=self.uri.bucket, Prefix=prefix, Delimiter="/"),
                          "list", prefix)
        return sorted(p["Prefix"] for p in page.get("CommonPrefixes", []))

    def get_small(self, key: str, limit: int = MAX_ENVELOPE_BYTES) -> bytes:
        resp = self._call(lambda: self.client.get_object(Bucket=self.uri.bucket, Key=key), "GET", key)
        data = resp["Body"].read(limit + 1)
        if len(data) > limit:
            raise NodewarmError(f"s3://{self.uri.bucket}/{key} is larger than {limit} bytes; not a manifest",
                                reason="BundleTampered")
        return data

    def download(self, key: str, dest: Path, max_bytes: int) -> int:
        """Stream an object to ``dest``; refuses one larger than ``max_bytes`` before reading it."""
        head = self._call(lambda: self.client.head_object(Bucket=self.uri.bucket, Key=key), "HEAD", key)
        if int(head["ContentLength"]) > max_bytes:
            raise NodewarmError(f"s3://{self.uri.bucket}/{key} is {head['ContentLength']} bytes, "
                                f"over the {max_bytes} expected", reason="ObjectTooLarge")

        def fetch() -> int:
            # Pinned to the ETag we sized, so a replaced object fails instead of being mixed in.
            resp = self.client.get_object(Bucket=self.uri.bucket, Key=key, IfMatch=head["ETag"])
            n = 0
            try:
                out = open(dest, "wb", buffering=0)
            except OSError as e:
                raise write_error(e, dest) from e
            with out:
                for chunk in resp["Body"].iter_chunks(1 << 20):
                    n += len(chunk)
                    view = memoryview(chunk)
                    try:
                        # Unbuffered: a full disk fails here as a local error, not as a retried S3 read.
                        while view:
                            view = view[out.write(view):]
                    except OSError as e:
                        raise write_error(e, dest) from e
            return n
        return self._call(fetch, "GET", key)

    def put(self, key: str, body: bytes | Path) -> None:
        def send():
            if isinstance(body, Path):
                with open(body, "rb") as f:
                    self.client.put_object(Bucket=self.uri.bucket, Key=key, Body=f)
            else:
                self.client.put_object(Bucket=self.uri.bucket, Key=key, Body=body)
        self._call(send, "PUT", key)

    def _conditional_put(self, key: str, body: bytes, what: str, **condition: str) -> bool:
        """PUT with a precondition; False when it does not hold (412) or a concurrent conditional write is
        still in flight (409)."""
        try:
            self._call(lambda: self.client.put_object(Bucket=self.uri.bucket, Key=key, Body=body, **condition),
                       what, key)
            return True
        except NodewarmError as e:
            response = getattr(e.__cause__, "response", None) or {}
            if response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                return False
            raise

    def put_if_absent(self, key: str, body: bytes) -> bool:
        """PUT with If-None-Match: * ; False when someone wrote it first."""
        return self._conditional_put(key, body, "PUT-if-absent", IfNoneMatch="*")

    def get_with_etag(self, key: str, limit: int = MAX_ENVELOPE_BYTES) -> tuple[bytes, str] | None:
        """A small object and its ETag (for a later If-Match), or None when absent."""
        try:
            resp = self._call(lambda: self.client.get_object(Bucket=self.uri.bucket, Key=key), "GET", key)
        except S3ObjectMissing:
            return None
        data = resp["Body"].read(limit + 1)
        if len(data) > limit:
            raise NodewarmError(f"s3://{self.uri.bucket}/{key} is larger than {limit} bytes; not a manifest",
                                reason="BundleTampered")
        return data, resp["ETag"]

    def put_if_match(self, key: str, body: bytes, etag: str) -> bool:
        """PUT with If-Match: ETAG; False when the object changed meanwhile."""
        return self._conditional_put(key, body, "PUT-if-match", IfMatch=etag)

    def tidy(self, key: str) -> bool:
        """Best-effort delete of our own leftovers (claims, losing blobs). The rendered IAM policy grants
        no s3:DeleteObject, so a refusal is expected there and only costs a few stray bytes."""
        try:
            self._call(lambda: self.client.delete_object(Bucket=self.uri.bucket, Key=key), "DELETE", key)
            return True
        except NodewarmError as e:
            log.info("compilecache.store.tidy_skipped", key=key, reason=e.reason)
            return False

    def conditional_writes(self) -> bool:
        """Does the server honour If-None-Match: * on PUT? Probed once per store (rclone ignores it, AWS
        does not) on one fixed key, so no delete is needed: a server that honours it refuses the second
        write (or the first, when an earlier probe left the object)."""
        if self._conditional is None:
            probe = f"{self.root}.nodewarm-conditional-write-probe"
            self._conditional = not (self.put_if_absent(probe, b"probe") and self.put_if_absent(probe, b"probe"))
            log.info("compilecache.store.probe", uri=str(self.uri), conditional_writes=self._conditional)
        return self._conditional

