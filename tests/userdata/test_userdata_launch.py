"""The rendered nodewarm-launch script, run for real: download from S3, refuse a wrong sha256, run, cache."""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
import time

import pytest

from nodewarm.bootstrap import launchrecord
from nodewarm.userdata.package import launcher
from support.launch import BUCKET, launch_script, run_launch, tiny_artifact

@pytest.mark.s3
def test_a_wrong_sha256_is_refused_and_nothing_runs(tmp_path, s3, bucket, aws_path):
    blob = tiny_artifact()
    bucket.put_object(Bucket=BUCKET, Key="wrong/artifact.tar.gz", Body=blob)
    pinned = hashlib.sha256(blob + b"tampered").hexdigest()
    run = run_launch(tmp_path, s3, aws_path, f"s3://{BUCKET}/wrong/artifact.tar.gz", pinned)
    assert run.returncode == 3, run.stderr
    assert "refusing" in run.stderr and hashlib.sha256(blob).hexdigest() in run.stderr and pinned in run.stderr
    assert "ran:" not in run.stdout
    assert os.listdir(tmp_path / "opt" / "artifacts") == []      # nothing unpacked, no partial download left
    record = launchrecord.read(tmp_path / "state")               # for the agent to report when it can
    assert (record.reason, record.status) == ("ArtifactRejected", 3) and pinned in record.message


@pytest.mark.s3
def test_the_pinned_artifact_runs_and_is_not_fetched_again(tmp_path, s3, bucket, aws_path):
    blob = tiny_artifact()
    sha = hashlib.sha256(blob).hexdigest()
    uri = f"s3://{BUCKET}/right/artifact.tar.gz"
    bucket.put_object(Bucket=BUCKET, Key="right/artifact.tar.gz", Body=blob)
    first = run_launch(tmp_path, s3, aws_path, uri, sha)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "ran: bootstrap run --profile p\n"
    # A restart of the unit reuses the unpacked artifact: gone from S3, it still runs.
    bucket.delete_object(Bucket=BUCKET, Key="right/artifact.tar.gz")
    second = run_launch(tmp_path, s3, aws_path, uri, sha)
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr
    assert os.listdir(tmp_path / "opt" / "artifacts") == [sha]
    assert launchrecord.read(tmp_path / "state") is None          # nothing failed: nothing to report


@pytest.mark.s3
def test_a_missing_artifact_fails_with_a_retryable_status(tmp_path, s3, bucket, aws_path):
    run = run_launch(tmp_path, s3, aws_path, f"s3://{BUCKET}/absent/artifact.tar.gz", "0" * 64)
    assert run.returncode not in (0, 2, 3), run      # 2 and 3 stop the unit's restarts
    assert os.listdir(tmp_path / "opt" / "artifacts") == []
    record = launchrecord.read(tmp_path / "state")
    assert record.reason == "ArtifactFetchFailed" and f"s3://{BUCKET}/absent/artifact.tar.gz" in record.message
    assert record.status == run.returncode and record.time.endswith("Z")


@pytest.mark.s3
def test_a_node_with_an_older_glibc_refuses_the_artifact_and_records_why(tmp_path, s3, bucket, aws_path):
    # The real bin/nodewarm of an artifact that needs glibc 2.34, on a node whose getconf says 2.17.
    blob = tiny_artifact(launcher("3.11", os.uname().machine, "2.34").encode())
    uri = f"s3://{BUCKET}/oldglibc/artifact.tar.gz"
    bucket.put_object(Bucket=BUCKET, Key="oldglibc/artifact.tar.gz", Body=blob)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "getconf").write_text("#!/bin/sh\necho 'glibc 2.17'\n")
    (fake / "getconf").chmod(0o755)
    run = run_launch(tmp_path, s3, f"{fake}:{aws_path}", uri, hashlib.sha256(blob).hexdigest())
    assert run.returncode == 3, run                  # not retried by the unit: the same node cannot change
    record = launchrecord.read(tmp_path / "state")
    assert record.reason == "ArtifactRejected"
    assert "needs glibc >= 2.34 but this node has glibc 2.17" in record.message and "amazonlinux:2023" in record.message


@pytest.mark.s3
def test_the_launcher_tells_the_agent_when_it_started(tmp_path, s3, bucket, aws_path):
    blob = tiny_artifact(b'#!/bin/sh\necho "$NODEWARM_LAUNCH_STARTED"\n')
    bucket.put_object(Bucket=BUCKET, Key="started/artifact.tar.gz", Body=blob)
    before = time.time()
    run = run_launch(tmp_path, s3, aws_path, f"s3://{BUCKET}/started/artifact.tar.gz", hashlib.sha256(blob).hexdigest())
    after = time.time()
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"\d+\.\d{9}\n", run.stdout), run.stdout       # epoch seconds, nanosecond digits
    assert before <= float(run.stdout) <= after                       # this launch's clock, not a stale value


def test_artifact_launch_skips_the_torch_load_check_and_the_daemonset_keeps_it():
    from nodewarm.userdata.launch import BootstrapLaunch

    common = dict(profile="m", cache_mount="/mnt/k8s-disks/0")
    host = BootstrapLaunch(**common, artifact_uri="s3://cache-bucket/nodewarm/a.tar.gz", artifact_sha256="a" * 64)
    pod = BootstrapLaunch(**common)
    assert "--skip-load-check" in host.bootstrap_argv()
    assert "--skip-load-check" not in pod.bootstrap_argv()


class _Imds:
    """IMDSv2 as an EC2 instance serves it (token by PUT, then placement/region with the token), on loopback."""

    def __init__(self, region: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        import threading

        imds = self
        self.requests: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                imds.requests.append(("PUT", self.path))
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                self._send(200 if ok else 400, b"tok-123" if ok else b"")

            def do_GET(self):
                imds.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    return self._send(401, b"")
                self._send(200 if self.path == "/latest/meta-data/placement/region" else 404, region.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.mark.s3
def test_the_region_comes_from_instance_metadata_not_the_user_data(tmp_path, s3, bucket, aws_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        body = b'#!/bin/sh\necho "region: $AWS_REGION $AWS_DEFAULT_REGION"\n'
        info = tarfile.TarInfo("bin/nodewarm")
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    blob = out.getvalue()
    bucket.put_object(Bucket=BUCKET, Key="region/artifact.tar.gz", Body=blob)
    uri, sha = f"s3://{BUCKET}/region/artifact.tar.gz", hashlib.sha256(blob).hexdigest()
    script = tmp_path / "nodewarm-launch"
    script.write_text(launch_script(uri, sha))
    imds = _Imds("eu-central-1")
    try:
        env = {k: v for k, v in {**os.environ, **s3.env()}.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
        env.update(PATH=aws_path, NODEWARM_ROOT=str(tmp_path / "opt"), NODEWARM_ARTIFACT_URI=uri,
                   NODEWARM_ARTIFACT_SHA256=sha, NODEWARM_IMDS_ENDPOINT=imds.url)
        run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        imds.close()
    assert run.returncode == 0, run.stderr
    assert run.stdout == "region: eu-central-1 eu-central-1\n"
    assert imds.requests == [("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/placement/region")]


def test_the_agent_takes_the_region_from_the_profile_then_the_node_label_then_instance_metadata():
    from nodewarm import profile
    from nodewarm.bootstrap.profilesource import region_for
    from support.builders import v

    p = profile.from_dict(v())                                       # spec.nodes.region: us-west-2
    node = {"metadata": {"labels": {"topology.kubernetes.io/region": "ap-south-1"}}}
    assert region_for(p, node) == "us-west-2"
    p = profile.from_dict(v(spec__nodes__region=None))
    assert region_for(p, node) == "ap-south-1"
    imds = _Imds("sa-east-1")
    try:
        assert region_for(p, {"metadata": {}}, imds.url) == "sa-east-1"
    finally:
        imds.close()
    assert region_for(p, {"metadata": {}}, "http://127.0.0.1:9") is None    # unreachable (a pod on Auto Mode)
