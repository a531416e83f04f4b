"""The serving image's software, signed, one descriptor per image: how a node without that image's torch
(the AL2023 host agent, the DaemonSet agent in its own image) learns the software half of the key.

Only software is in it (torch/triton/vLLM versions, build hashes, install paths, the image's compile env);
hardware is always the reading node's own (hardware.py). The image reference is inside the signed payload
and must equal the one the reader serves, so a descriptor can never be passed off for another image.
"""

from __future__ import annotations

from typing import Any, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from nodewarm.api.errors import NodewarmError

from . import cachekey, signing
from .cachestore import CacheStore, runtime_key


class RuntimeUnknown(NodewarmError):
    reason = "RuntimeUnknown"


def image_digest(image: str) -> str:
    """The digest in an image reference (``repo@sha256:...`` or a bare ``sha256:...``), else ""."""
    tail = image.rpartition("@")[2] if "@" in image else image
    return tail if tail.startswith("sha256:") else ""


def payload(image: str, probe: cachekey.RuntimeProbe, env: Mapping[str, str]) -> dict[str, Any]:
    from dataclasses import asdict

    return {"image": image, "digest": image_digest(image), "runtime": asdict(probe),
            "env": dict(cachekey.relevant_env(env))}


def write(store: CacheStore, image: str, probe: cachekey.RuntimeProbe, env: Mapping[str, str],
          key: Ed25519PrivateKey) -> str:
    """Write (or refresh) this image's descriptor; returns its key."""
    if not image:
        raise RuntimeUnknown("serving.image is empty: a runtime descriptor is kept per image")
    k = runtime_key(store.root, image)
    store.put(k, signing.seal(payload(image, probe, env), key))
    return k


def read(store: CacheStore, image: str, verify_key: Ed25519PublicKey) -> tuple[cachekey.RuntimeProbe, dict[str, str]]:
    """The verified software of ``image``; RuntimeUnknown when none was published yet."""
    if not image:
        raise RuntimeUnknown("serving.image is empty, so no runtime descriptor can be looked up; pass --runtime "
                             "from `compile-cache key --runtime-only` run in the serving image")
    k = runtime_key(store.root, image)
    if not store.exists(k):
        raise RuntimeUnknown(f"no runtime descriptor for image {image!r} at s3://{store.uri.bucket}/{k} and this "
                             "process is not the serving image: the first node compiles and its publisher writes "
                             "it (or pass --runtime from `compile-cache key --runtime-only` in the serving image)")
    doc = signing.open_envelope(store.get_small(k), verify_key)
    if doc.get("image") != image:
        raise signing.BundleTampered(f"runtime descriptor {k} is signed for image {doc.get('image')!r}, "
                                     f"not {image!r}")
    try:
        return cachekey.probe_from_dict(doc["runtime"]), dict(doc["env"])
    except (KeyError, TypeError, ValueError) as e:
        raise signing.BundleTampered(f"signed runtime descriptor {k} is malformed: {e}") from None
