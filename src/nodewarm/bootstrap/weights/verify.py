"""Prove a downloaded file holds exactly the S3 object's bytes before it gets its real name.

Strongest available evidence first: the object's S3 additional checksum (full-object, or composite
"-N" recomputed per part), else the ETag when it is an MD5 (single part: MD5 of the bytes; multipart:
MD5 of the part MD5s, "-N"). An object with neither (SSE-KMS/SSE-C without checksums, a multipart
ETag whose part layout is unknown) cannot be verified: its SHA-256 is computed and recorded and the file
is labelled UNVERIFIED, never "verified" (a size check proves nothing: the temp file is preallocated).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from awscrt import checksums

from nodewarm.api.errors import NodewarmError

from .manifest import UNVERIFIED, RemoteObject

MiB = 1024 * 1024
READ_CHUNK = 8 * MiB
CRC_SEGMENT = 64 * MiB
# Upload parts up to this size are fetched one ranged GET each, so each part's checksum (or MD5) comes
# out of the download itself; larger parts would leave too few GETs to keep a big file's pull parallel.
MAX_ALIGNED_PART = 64 * MiB


class VerifyFailed(NodewarmError):
    reason = "VerifyFailed"


class _Crc:
    """A CRC as a hashlib-like object; S3 sends the big-endian bytes, base64-encoded."""

    def __init__(self, fn: Callable[[bytes, int], int], width: int):
        self._fn, self._width, self._value = fn, width, 0

    def update(self, data) -> None:
        self._value = self._fn(data, self._value)

    @property
    def value(self) -> int:
        return self._value

    def digest(self) -> bytes:
        return self._value.to_bytes(self._width, "big")


def _crt(name: str) -> Callable[[bytes, int], int] | None:
    return getattr(checksums, name, None)


def _crc32() -> Callable[[bytes, int], int]:
    """CRC32, the checksum boto3 and the aws CLI put on uploads by default: zlib-ng's when installed.

    awscrt computes CRC32C and CRC64NVME with the CPU's instructions but CRC32 in software on x86: measured
    here (AMD EPYC, AVX-512), 2.8 GB/s per core against 33 GB/s for zlib-ng (PCLMULQDQ/VPCLMULQDQ, and the
    ARMv8 CRC instructions on Graviton) and 3.9 GB/s for the stdlib's zlib. In a pull every byte is hashed
    once as it lands, so at 2.8 GB/s the checksum was a fifth of the pull's CPU (perf). All three release
    the GIL and give the same value."""
    try:
        from zlib_ng import zlib_ng

        return zlib_ng.crc32
    except ImportError:
        return _crt("crc32") or zlib.crc32


def hasher_factory(algorithm: str) -> Callable[[], object] | None:
    """A constructor for a fresh hasher, or None when this install cannot compute ``algorithm``."""
    if algorithm in ("CRC32", "CRC32C", "CRC64NVME"):
        # CRC32C and CRC64NVME: awscrt's, on the CPU's instructions (no fallback: they would crawl in
        # pure Python). CRC32: see _crc32.
        fn = _crc32() if algorithm == "CRC32" else _crt(algorithm.lower())
        width = 8 if algorithm == "CRC64NVME" else 4
        return (lambda: _Crc(fn, width)) if fn else None
    if algorithm in ("SHA1", "SHA256", "MD5"):
        return lambda: hashlib.new(algorithm.lower())
    return None


@dataclass(frozen=True)
class Method:
    """How a file will be checked: ``algorithm`` over parts of ``part_sizes`` (None: whole file)."""

    name: str  # e.g. "checksum-crc32c", "checksum-crc32-composite", "etag-md5", "etag-md5-multipart", UNVERIFIED
    algorithm: str
    expected: str | None  # None: nothing to compare with (UNVERIFIED: the SHA-256 is only recorded)
    part_sizes: tuple[int, ...] | None = None


def _part_sizes(obj: RemoteObject) -> tuple[int, ...] | None:
    # Uploaders (aws CLI, boto3, huggingface) use one part size for all but the last part.
    n, first = obj.parts_count, obj.first_part_size
    if not n or not first:
        return None
    last = obj.size - first * (n - 1)
    if not 0 < last <= first:
        return None
    return (first,) * (n - 1) + (last,)


def method_for(obj: RemoteObject) -> Method:
    """Choose the strongest check this object and this install support. Pure."""
    if obj.checksum and obj.checksum_algorithm and hasher_factory(obj.checksum_algorithm):
        algo = obj.checksum_algorithm
        if "-" not in obj.checksum:
            return Method(f"checksum-{algo.lower()}", algo, obj.checksum)
        sizes = _part_sizes(obj)
        if sizes:
            return Method(f"checksum-{algo.lower()}-composite", algo, obj.checksum, sizes)
    if obj.etag and not obj.encrypted_etag:
        if "-" not in obj.etag:
            return Method("etag-md5", "MD5", obj.etag.lower())
        sizes = _part_sizes(obj)
        if sizes:
            return Method("etag-md5-multipart", "MD5", obj.etag.lower(), sizes)
    return Method(UNVERIFIED, "SHA256", None)


def aligned_part_size(m: Method) -> int | None:
    """The ranged-GET size that makes each GET one upload part, when the check is built from parts."""
    if m.part_sizes is not None and m.expected is not None and m.part_sizes[0] <= MAX_ALIGNED_PART:
        return m.part_sizes[0]
    return None


def part_digest_algorithm(m: Method) -> str:
    """What each downloaded part is hashed with as it lands. It is journaled (resume proves a part's
    bytes still match) and, when it is the method's own algorithm, combined into the final check, so
    the file is never read a second time: S3 parts (composite checksums, "-N" MD5 ETags) when the GETs
    are aligned to them, and any split of a full-object CRC (CRCs combine). Otherwise CRC32C, the
    cheapest, for the journal only."""
    if m.expected is None:
        return "CRC32C"
    if m.part_sizes is not None:
        return m.algorithm if aligned_part_size(m) else "CRC32C"
    return m.algorithm if m.algorithm.startswith("CRC") and hasher_factory(m.algorithm) else "CRC32C"


def digest_from_parts(m: Method, digests: list[bytes], sizes: list[int]) -> str:
    """The object-level value S3 reports, from the per-part digests (part_digest_algorithm(m) == m.algorithm)."""
    if m.part_sizes is not None:
        combined = hasher_factory(m.algorithm)()
        for d in digests:
            combined.update(d)
        return f"{_encode(m.algorithm, combined.digest())}-{len(digests)}"
    combine = _crt(f"combine_{m.algorithm.lower()}")
    value = int.from_bytes(digests[0], "big") if digests else 0
    for d, length in zip(digests[1:], sizes[1:]):
        value = combine(value, int.from_bytes(d, "big"), length)
    return _encode(m.algorithm, value.to_bytes(8 if m.algorithm == "CRC64NVME" else 4, "big"))


def _encode(algorithm: str, digest: bytes) -> str:
    return digest.hex() if algorithm == "MD5" else base64.b64encode(digest).decode()


def _hash_range(fd: int, offset: int, length: int, h):
    buf = bytearray(min(READ_CHUNK, max(length, 1)))
    view = memoryview(buf)
    while length:
        n = os.preadv(fd, [view[:min(length, len(buf))]], offset)
        if not n:
            raise VerifyFailed(f"file ended {length} bytes early while verifying")
        h.update(view[:n])
        offset, length = offset + n, length - n
    return h


def _ranges(sizes) -> list[tuple[int, int]]:
    out, off = [], 0
    for size in sizes:
        out.append((off, size))
        off += size
    return out


def _digest_file(path: Path, m: Method, size: int, workers: int) -> str:
    """Hash ``path`` as S3 did. Independent pieces (S3 parts, CRC segments) are hashed in parallel:
    hashlib and the CRCs release the GIL, so a multi-GB shard verifies at several cores' speed."""
    new = hasher_factory(m.algorithm)
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            if m.part_sizes is not None:
                parts = pool.map(lambda r: _hash_range(fd, r[0], r[1], new()).digest(), _ranges(m.part_sizes))
                combined = new()
                for digest in parts:
                    combined.update(digest)
                return f"{_encode(m.algorithm, combined.digest())}-{len(m.part_sizes)}"
            combine = _crt(f"combine_{m.algorithm.lower()}") if m.algorithm.startswith("CRC") else None
            if combine is None or size <= CRC_SEGMENT:
                return _encode(m.algorithm, _hash_range(fd, 0, size, new()).digest())
            segments = _ranges([CRC_SEGMENT] * (size // CRC_SEGMENT) + ([size % CRC_SEGMENT] if size % CRC_SEGMENT else []))
            crcs = list(pool.map(lambda r: _hash_range(fd, r[0], r[1], new()).value, segments))
            value = crcs[0]
            for crc, (_, length) in zip(crcs[1:], segments[1:]):
                value = combine(value, crc, length)
            return _encode(m.algorithm, value.to_bytes(8 if m.algorithm == "CRC64NVME" else 4, "big"))
    finally:
        os.close(fd)


class StreamHash:
    """A whole-file hash fed in order while the file downloads, for methods that cannot be split
    (MD5 of a single-part ETag, SHA full-object checksums): verification then ends with the download
    instead of re-reading the file afterwards on one core."""

    def __init__(self, m: Method):
        self.method = m
        self._h = hasher_factory(m.algorithm)()

    @staticmethod
    def applies(m: Method) -> bool:
        return m.algorithm in ("MD5", "SHA1", "SHA256") and m.part_sizes is None

    def update_from(self, fd: int, offset: int, length: int) -> None:
        _hash_range(fd, offset, length, self._h)

    def value(self) -> str:
        return _encode(self.method.algorithm, self._h.digest())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _check(obj: RemoteObject, m: Method, got: str) -> str:
    if got != m.expected:
        raise VerifyFailed(f"{obj.rel_path}: {m.name} is {got}, S3 says {m.expected} (corrupted in transit?)")
    return m.name


def verify_file(path: Path, obj: RemoteObject, workers: int = 4, streamed: StreamHash | None = None,
                part_digests: tuple[list[bytes], list[int]] | None = None) -> str:
    """Check ``path`` against ``obj``; returns the method name, raises VerifyFailed naming the file.

    With ``streamed`` (the file's bytes already hashed in order as they landed) or ``part_digests``
    (each part hashed with the method's algorithm as it landed, and the parts' sizes) nothing is re-read.
    """
    size = path.stat().st_size
    if size != obj.size:
        raise VerifyFailed(f"{obj.rel_path}: {size} bytes on disk, S3 says {obj.size}")
    m = method_for(obj)
    if m.expected is None:
        return m.name  # the caller records the streamed SHA-256
    if streamed is not None:
        return _check(obj, m, streamed.value())
    if part_digests is not None:
        return _check(obj, m, digest_from_parts(m, *part_digests))
    return _check(obj, m, _digest_file(path, m, size, workers))
