"""Ed25519 envelopes: what verifies, and the reason given for everything that does not."""

from __future__ import annotations

import base64
import json
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodewarm.bootstrap.compilecache import signing
from nodewarm.bootstrap.compilecache.signing import BundleTampered, BundleUnsigned, SigningKeyError

MANIFEST = {"key_id": "abc", "sha256": "00" * 32, "size": 10, "factors": {"cpu_isa": "avx512"}}


@pytest.fixture
def pair(tmp_path):
    kp = signing.generate(tmp_path / "signing.pem")
    return signing.load_private(kp.private_path), signing.load_public(kp.public), kp


def test_generate_writes_a_private_file_and_prints_a_short_verify_key(pair, tmp_path):
    _, pub, kp = pair
    assert stat.S_IMODE((tmp_path / "signing.pem").stat().st_mode) == 0o600
    assert len(base64.b64decode(kp.public)) == 32 and kp.key_id == signing.key_id(pub)
    with pytest.raises(FileExistsError):  # never overwrite a key silently
        signing.generate(tmp_path / "signing.pem")


def test_seal_and_open_roundtrip(pair):
    priv, pub, _ = pair
    assert signing.open_envelope(signing.seal(MANIFEST, priv), pub) == MANIFEST


def test_verify_key_forms(pair, tmp_path):
    priv, pub, kp = pair
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    (tmp_path / "pub.txt").write_text(kp.public + "\n")
    for form in (kp.public, pem, str(tmp_path / "pub.txt")):
        assert signing.key_id(signing.load_public(form)) == kp.key_id
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(SigningKeyError):
            signing.load_public(bad)
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(SigningKeyError, match="keygen"):
        signing.load_private(tmp_path / "junk.pem")


def test_modified_manifest_is_tampered(pair):
    priv, pub, _ = pair
    env = json.loads(signing.seal(MANIFEST, priv))
    env["manifest"]["factors"]["cpu_isa"] = "avx2"
    with pytest.raises(BundleTampered, match="modified after signing"):
        signing.open_envelope(json.dumps(env).encode(), pub)


def test_unsigned_and_other_key_and_garbage(pair):
    priv, pub, _ = pair
    env = json.loads(signing.seal(MANIFEST, priv))
    del env["signature"]
    with pytest.raises(BundleUnsigned):
        signing.open_envelope(json.dumps(env).encode(), pub)

    other = Ed25519PrivateKey.generate()
    with pytest.raises(BundleTampered, match="not by the profile's verify key"):
        signing.open_envelope(signing.seal(MANIFEST, other), pub)

    forged = json.loads(signing.seal(MANIFEST, other))
    forged["signature"]["keyId"] = signing.key_id(pub)  # claims our key, signed by another
    with pytest.raises(BundleTampered, match="does not match"):
        signing.open_envelope(json.dumps(forged).encode(), pub)

    for data in (b"\x00garbage", b"[]", json.dumps({"format": "other/v9", "manifest": {}}).encode()):
        with pytest.raises(BundleTampered):
            signing.open_envelope(data, pub)
