"""An S3 endpoint that names its scheme's default port (``http://minio.minio.svc:80``, ``https://s3.example:443``),
as a cluster's Service address often does. botocore signs the host without that port but keeps the port in the
presigned URL; the pull's own transport must send the Host that was signed, or every HEAD and GET is a 403
(found with the agent's DaemonSet pod reaching S3 through a Service on port 80)."""

from __future__ import annotations

import random

import pytest

from support.bootstrap_fixtures import model_files, point_aws_env, put_model, visible_files, warm
from nodewarm.bootstrap.weights.rangeget import host_header
from nodewarm_dev.testenv.podservices import Relay


@pytest.mark.parametrize("url, host", [
    ("http://minio.svc:80/b/k?X-Amz-Signature=1", "minio.svc"),
    ("https://s3.example:443/b/k", "s3.example"),
    ("http://minio.svc:9000/b/k", "minio.svc:9000"),
    ("https://s3.example:80/b/k", "s3.example:80"),       # not https's default: signed with the port
    ("http://minio.svc/b/k", "minio.svc"),
    ("http://[fd00::1]:80/b/k", "[fd00::1]"),
    ("http://[fd00::1]:8080/b/k", "[fd00::1]:8080"),
])
def test_the_host_sent_is_the_host_botocore_signed(url, host):
    assert host_header(url) == host


@pytest.mark.s3
def test_a_pull_from_an_endpoint_on_port_80_verifies_every_file(s3, tmp_path, monkeypatch):
    files = model_files(shards=2, mib_per_shard=1)
    uri = put_model(s3, files)
    s3_host, s3_port = s3.endpoint.removeprefix("http://").rsplit(":", 1)
    # Port 80 on a loopback address of its own (all of 127/8 is this host's), so no other listener is in the way.
    relay = Relay((f"127.0.{random.randint(100, 250)}.{random.randint(2, 250)}", 80), (s3_host, int(s3_port))).start()
    try:
        point_aws_env(s3, monkeypatch)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{relay.listen[0]}:80")
        summary = warm(uri, tmp_path / "model")
        assert summary.ok, summary
        assert visible_files(tmp_path / "model") == files
    finally:
        relay.close()
