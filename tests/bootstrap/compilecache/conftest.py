"""Fixtures of the compile-cache tests: each S3 engine in turn, a fresh cache bucket on it, a signing key pair."""

from __future__ import annotations

import uuid

import pytest

from nodewarm.bootstrap.compilecache import signing
from support.bootstrap_fixtures import cache_store


@pytest.fixture(params=["rclone", "seaweedfs"])
def server(request):
    """rclone (no conditional writes: the claim protocol decides) and SeaweedFS (If-None-Match and If-Match)."""
    return request.getfixturevalue({"rclone": "s3", "seaweedfs": "s3_exact"}[request.param])


@pytest.fixture
def store(server, monkeypatch):
    bucket = "cc-" + uuid.uuid4().hex[:12]
    server.create_bucket(bucket)
    return cache_store(server, monkeypatch, f"s3://{bucket}/compile-cache")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    pair = signing.generate(tmp_path_factory.mktemp("keys") / "signing.pem")
    return signing.load_private(pair.private_path), signing.load_public(pair.public)
