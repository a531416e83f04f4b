"""Faults between us and S3, injected by a proxy in front of the real local server.

Every case must end either complete and verified, or failed with a clear reason and nothing half-visible.
"""

from __future__ import annotations

import logging
import threading

import pytest

from support.bootstrap_fixtures import KiB, model_files, put_model, visible_files, warm
from nodewarm_dev.testenv.faultproxy import Corrupt, Hook, Reset, Stall, Trickle, Truncate, first_n
from support.s3faults import Reply
from nodewarm.bootstrap.weights.manifest import parse_s3_uri
from nodewarm.bootstrap.s3client import RetryPolicy
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.s3


MODEL = dict(shards=2, mib_per_shard=1.5, seed=11)


@pytest.fixture(scope="module")
def model(s3):
    """The module's model, uploaded once: the tests that use it only read it."""
    files = model_files(**MODEL)
    return files, put_model(s3, files)


@pytest.fixture
def own_model(s3):
    """A test's own copy of the same model, for a test that deletes or replaces one of its objects."""
    files = model_files(**MODEL)
    return files, put_model(s3, files)


def big_get(req) -> bool:
    """A ranged GET of a whole 512 KiB part of a shard: the JSON files and a shard's short last part (its
    header makes it 1.5 MiB + a few bytes) end before the faults start, and which GET comes first is a race."""
    if not (req.is_get and req.path.endswith(".safetensors")):
        return False
    first, _, last = req.headers["range"].removeprefix("bytes=").partition("-")
    return int(last) - int(first) + 1 > 256 * KiB


def assert_complete(summary, dest, files):
    assert summary.ok and visible_files(dest) == files
    assert sum(summary.verified.values()) == len(files)


def assert_failed_cleanly(exc, dest, files, reason):
    assert exc.reason == reason, exc
    visible = visible_files(dest) if dest.exists() else {}
    # Whatever is visible is complete and exact; nothing half-written has a final name.
    assert all(files[name] == data for name, data in visible.items())


@pytest.mark.parametrize("fault", [
    Reply(503, "SlowDown"),
    Reply(500, "InternalError"),
    Reset(after=100 * KiB),
    Truncate(after=200 * KiB),
    Corrupt(at=1000),
], ids=["503-slowdown", "500", "reset-mid-body", "truncated-body", "corrupted-body"])
def test_transient_fault_on_ranged_gets_is_retried_to_a_verified_copy(model, proxy, tmp_path, fault):
    files, uri = model
    proxy.rule = first_n(3, fault, match=big_get)
    summary = warm(uri, tmp_path / "m")
    assert_complete(summary, tmp_path / "m", files)
    assert len(proxy.gets()) > -(-sum(map(len, files.values())) // (512 * KiB))  # retries happened


def test_errors_on_listing_and_head_are_retried(model, proxy, tmp_path):
    files, uri = model
    seen = set()

    def once_per_request(r):  # the listing and every HEAD fail once
        if r.is_get or (r.method, r.path) in seen:
            return None
        seen.add((r.method, r.path))
        return Reply(500, "InternalError")

    proxy.rule = once_per_request
    assert_complete(warm(uri, tmp_path / "m"), tmp_path / "m", files)
    assert len(seen) == 1 + len(files)


@pytest.fixture
def retries():
    """The s3.retry events logged during the test (a handler of our own: immune to logs.setup())."""
    events = []

    class Collect(logging.Handler):
        def emit(self, record):
            events.append(getattr(record, "fields", {}))

    logger = logging.getLogger("nodewarm.bootstrap.s3")
    handler = Collect(level=logging.WARNING)
    logger.addHandler(handler)
    yield events
    logger.removeHandler(handler)


def test_stalled_connection_is_dropped_and_the_part_retried(model, proxy, tmp_path, retries):
    files, uri = model
    proxy.rule = first_n(2, Stall(after=64 * KiB, seconds=30), match=big_get)
    summary = warm(uri, tmp_path / "m", stall_timeout_s=1.0)
    assert_complete(summary, tmp_path / "m", files)
    assert sum("timeout" in e["error"].lower() for e in retries) == 2


def test_connection_below_the_low_speed_limit_is_dropped_and_the_part_retried(model, proxy, tmp_path, retries):
    files, uri = model
    proxy.rule = first_n(1, Trickle(bytes_per_s=50_000), match=big_get)  # never silent: no read timeout
    summary = warm(uri, tmp_path / "m", low_speed_limit_bps=200_000, low_speed_time_s=0.5)
    assert_complete(summary, tmp_path / "m", files)
    assert [e["error"] for e in retries if "slower than" in e["error"]] != []


def test_a_stop_ends_the_pull_at_once_and_the_next_run_resumes(model, proxy, tmp_path):
    """The agent sets WeightsConfig.stop when it is stopped (SIGTERM): the pull ends as PullStopped while its
    GETs still flow, rather than running to the end of the model, and keeps its parts for the next run."""
    files, uri = model
    flowing = threading.Event()

    def trickle(req):
        if big_get(req):
            flowing.set()
            return Trickle(bytes_per_s=20_000)  # a 512 KiB part takes ~26 s: no part ends before the stop
        return None

    proxy.rule = trickle
    stop, raised = threading.Event(), []

    def run():
        try:
            warm(uri, tmp_path / "m", stop=stop)
        except NodewarmError as e:
            raised.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert flowing.wait(60)
    stop.set()
    t.join(60)  # a bound on a hang, far below the ~1 min the trickled pull would take to finish
    assert not t.is_alive() and len(raised) == 1
    assert_failed_cleanly(raised[0], tmp_path / "m", files, "PullStopped")
    assert not any(name.endswith(".safetensors") for name in visible_files(tmp_path / "m"))
    proxy.rule = lambda r: None
    again = warm(uri, tmp_path / "m")  # what landed before the stop is kept, the rest fetched
    assert again.ok and visible_files(tmp_path / "m") == files and again.skipped + again.downloaded_files == len(files)


def test_server_that_stays_down_fails_with_s3unavailable(model, proxy, tmp_path):
    files, uri = model
    proxy.rule = lambda r: Reply(503, "SlowDown") if r.is_get else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m")
    assert_failed_cleanly(e.value, tmp_path / "m", files, "S3Unavailable")
    assert "gave up after 4 attempts" in str(e.value) and "SlowDown" in str(e.value)


def test_connection_that_always_stalls_fails_bounded(model, proxy, tmp_path):
    files, uri = model
    proxy.rule = lambda r: Stall(after=1024, seconds=30) if r.is_get else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m", stall_timeout_s=0.5, retry=RetryPolicy(attempts=2, base_s=0.01))
    assert_failed_cleanly(e.value, tmp_path / "m", files, "S3Unavailable")
    assert "timeout" in str(e.value).lower()


def test_wrong_credentials_fail_fast_without_a_retry_storm(model, proxy, tmp_path, monkeypatch):
    files, uri = model
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m")
    assert e.value.reason == "S3AccessDenied" and "SignatureDoesNotMatch" in str(e.value)
    assert len(proxy.requests) == 1
    assert not (tmp_path / "m").exists()


def test_object_deleted_mid_run_fails_with_its_name(s3, own_model, proxy, tmp_path):
    files, uri = own_model
    u = parse_s3_uri(uri)
    victim = "model-00002-of-00002.safetensors"
    done = threading.Event()

    def delete(req):
        if req.path.endswith(victim) and not done.is_set():
            done.set()
            s3.client().delete_object(Bucket=u.bucket, Key=u.prefix + victim)

    proxy.rule = lambda r: Hook(delete) if r.is_get else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m")
    assert_failed_cleanly(e.value, tmp_path / "m", files, "S3ObjectMissing")
    assert victim in str(e.value) and not (tmp_path / "m" / victim).exists()


def test_object_replaced_mid_run_fails_with_object_changed(s3, own_model, proxy, tmp_path):
    files, uri = own_model
    u = parse_s3_uri(uri)
    victim = "model-00001-of-00002.safetensors"
    done = threading.Event()

    def replace(req):
        if req.path.endswith(victim) and not done.is_set():
            done.set()
            s3.client().put_object(Bucket=u.bucket, Key=u.prefix + victim, Body=b"new" + files[victim][3:])

    proxy.rule = lambda r: Hook(replace) if r.is_get else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m", concurrency=1)
    assert_failed_cleanly(e.value, tmp_path / "m", files, "ObjectChanged")
    assert not (tmp_path / "m" / victim).exists()


def test_persistent_corruption_fails_verification(model, proxy, tmp_path):
    files, uri = model
    proxy.rule = lambda r: Corrupt(at=10) if r.is_get and r.headers["range"].startswith("bytes=0-") else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, tmp_path / "m")
    assert_failed_cleanly(e.value, tmp_path / "m", files, "VerifyFailed")
    assert "etag-md5" in str(e.value)
