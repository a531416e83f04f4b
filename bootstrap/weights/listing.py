"""What the model is in S3: list the prefix, HEAD each wanted object for its identity and checksums."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..s3client import RetryPolicy, S3ObjectMissing, S3Uri, call_with_retries
from .manifest import RemoteObject, rel_path_for, select


def _head(client, bucket: str, key: str, prefix: str, policy: RetryPolicy) -> RemoteObject:
    h = call_with_retries(lambda: client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"),
                          f"HEAD s3://{bucket}/{key}", policy)
    algo = next((a for a in ("CRC64NVME", "CRC32C", "CRC32", "SHA256", "SHA1") if h.get(f"Checksum{a}")), None)
    etag = h.get("ETag", "").strip('"')
    obj = RemoteObject(
        key=key,
        rel_path=rel_path_for(key, prefix),
        size=int(h["ContentLength"]),
        etag=etag,
        version_id=h.get("VersionId"),
        checksum_algorithm=algo,
        checksum=h.get(f"Checksum{algo}") if algo else None,
        checksum_type=h.get("ChecksumType"),
        encrypted_etag=h.get("ServerSideEncryption", "").startswith("aws:kms") or bool(h.get("SSECustomerAlgorithm")),
    )
    if obj.parts_count:
        # Part 1's size lets us recompute "-N" ETags and composite checksums without one HEAD per part.
        p1 = call_with_retries(lambda: client.head_object(Bucket=bucket, Key=key, PartNumber=1),
                               f"HEAD s3://{bucket}/{key}?partNumber=1", policy)
        obj = RemoteObject(**{**obj.__dict__, "first_part_size": int(p1["ContentLength"])})
    return obj


def list_model(client, uri: S3Uri, policy: RetryPolicy, workers: int = 16,
               exclude: tuple[str, ...] = ()) -> tuple[list[RemoteObject], list[str]]:
    """List the prefix and HEAD each wanted object (VersionId and checksums are not in the listing).

    Returns (objects sorted by key, skipped keys).
    """
    keys: list[str] = []
    token = None
    while True:
        kwargs = {"Bucket": uri.bucket, "Prefix": uri.prefix}
        if token:
            kwargs["ContinuationToken"] = token
        page = call_with_retries(lambda: client.list_objects_v2(**kwargs), f"list {uri}", policy)
        keys += [o["Key"] for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    wanted, skipped = select(keys, uri.prefix, exclude)
    if not wanted:
        raise S3ObjectMissing(f"nothing to pull under {uri} (listed {len(keys)} keys); check --uri")
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(wanted)))) as pool:
        objects = list(pool.map(lambda k: _head(client, uri.bucket, k, uri.prefix, policy), wanted))
    return sorted(objects, key=lambda o: o.key), skipped
