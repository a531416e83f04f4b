"""Ed25519 signatures over bundle manifests.

A bundle's manifest (factors, archive sha256 and size) is wrapped in an *envelope* that carries the
signature. Nodes hold only the public key (the profile's ``compileCache.verifyKey``); publishers
hold the private key (a file mounted from a secret). Signing the manifest, which pins the archive's
sha256, covers the archive too.

Keys: the private key is a PKCS#8 PEM file; the public key is the base64 of its 32 raw bytes (short
enough for a profile field) or a PEM. ``key_id`` is a short digest so a log can say which key signed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from nodewarm.api.errors import NodewarmError

from .cachekey import FORMAT, canonical_json

ALGORITHM = "ed25519"


class SigningKeyError(NodewarmError):
    reason = "InvalidSigningKey"


class BundleUnsigned(NodewarmError):
    reason = "BundleUnsigned"


class BundleTampered(NodewarmError):
    reason = "BundleTampered"


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw_public(key)).hexdigest()[:16]


def public_text(key: Ed25519PublicKey) -> str:
    """The form that goes into the profile's ``compileCache.verifyKey``."""
    return base64.b64encode(_raw_public(key)).decode()


def load_private(path: str | Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise SigningKeyError(f"cannot read the signing key {path}: {e}; create one with "
                              "`nodewarm bootstrap compile-cache keygen`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path} is not an Ed25519 private key")
    return key


def load_public(value: str) -> Ed25519PublicKey:
    """A verify key from a profile value: base64 raw key, a PEM, or a path to either."""
    text = value.strip()
    if not text.startswith("-----") and os.path.isfile(text):
        text = Path(text).read_text().strip()
    try:
        if text.startswith("-----"):
            key = serialization.load_pem_public_key(text.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError("not an Ed25519 key")
            return key
        raw = base64.b64decode(text, validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error) as e:
        raise SigningKeyError(f"compileCache.verifyKey is not an Ed25519 public key ({e}); use the "
                              "base64 line printed by `nodewarm bootstrap compile-cache keygen`") from None


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public: str
    key_id: str


def generate(private_path: str | Path) -> KeyPair:
    """Create a new signing key file (mode 0600); returns the verify key for the profile."""
    path = Path(private_path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key()
    return KeyPair(path, public_text(pub), key_id(pub))


def seal(manifest: dict[str, Any], key: Ed25519PrivateKey) -> bytes:
    """The envelope bytes: manifest plus a signature over its canonical JSON."""
    sig = key.sign(canonical_json(manifest))
    envelope = {
        "format": FORMAT,
        "manifest": manifest,
        "signature": {"alg": ALGORITHM, "keyId": key_id(key.public_key()), "value": base64.b64encode(sig).decode()},
    }
    return json.dumps(envelope, sort_keys=True, indent=1).encode()


def open_envelope(data: bytes, key: Ed25519PublicKey) -> dict[str, Any]:
    """Verify an envelope and return its manifest; raises BundleUnsigned or BundleTampered."""
    try:
        envelope = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleTampered(f"manifest is not JSON: {e}") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("manifest"), dict):
        raise BundleTampered("manifest envelope has no manifest object")
    if envelope.get("format") != FORMAT:
        raise BundleTampered(f"manifest format {envelope.get('format')!r} is not {FORMAT!r}")
    sig = envelope.get("signature")
    if not isinstance(sig, dict) or not sig.get("value"):
        raise BundleUnsigned("bundle has no signature; only signed bundles are restored")
    if sig.get("alg") != ALGORITHM:
        raise BundleUnsigned(f"bundle signature algorithm {sig.get('alg')!r} is not {ALGORITHM}")
    if sig.get("keyId") != key_id(key):
        raise BundleTampered(f"bundle was signed by key {sig.get('keyId')!r}, not by the profile's verify key "
                             f"{key_id(key)!r}")
    try:
        key.verify(base64.b64decode(sig["value"], validate=True), canonical_json(envelope["manifest"]))
    except (InvalidSignature, binascii.Error, ValueError):
        raise BundleTampered("bundle signature does not match its manifest (modified after signing)") from None
    return envelope["manifest"]
