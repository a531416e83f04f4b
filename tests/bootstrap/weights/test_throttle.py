"""A pull in the background (spec.weights.background): its bandwidth cap over all connections and the lower CPU and
I/O priority of its threads, against the real local S3 server."""

from __future__ import annotations

import ctypes
import os
import platform
import threading

import pytest

from support.bootstrap_fixtures import KiB, model_files, put_model, visible_files, warm
from nodewarm.bootstrap.weights import throttle
from nodewarm.bootstrap.weights.throttle import TokenBucket

MiB = 1024 * KiB
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())


def thread_nice(tid: int) -> int:
    stat = open(f"/proc/self/task/{tid}/stat").read()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of proc(5); the name before ")" may hold spaces


def thread_io_class(tid: int) -> int:
    return ctypes.CDLL(None, use_errno=True).syscall(_IOPRIO_GET, 1, tid) >> throttle.IOPRIO_CLASS_SHIFT


def test_the_cap_spreads_a_pull_over_its_bytes_divided_by_the_rate():
    now = [0.0]

    def sleep(s):
        now[0] += s
        return False

    bucket = TokenBucket(10 * MiB, lambda: now[0], sleep)
    # Four connections taking 4 MiB chunks in turn: 100 MiB at 10 MiB/s is 10 s, less the first second's burst.
    for _ in range(25):
        assert bucket.take(4 * MiB)
    assert now[0] == pytest.approx(9.0)


@pytest.mark.s3
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread priorities are read from Linux's /proc")
def test_a_background_pull_is_capped_and_its_threads_run_at_lower_priority(s3, proxy, tmp_path, monkeypatch):
    files = model_files(shards=2, mib_per_shard=1.5, seed=7)
    uri = put_model(s3, files)
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen, taken, lock = {}, [0], threading.Lock()
    take = TokenBucket.take

    def watching(self, n):
        tid = threading.get_native_id()  # a worker thread, while the pull runs
        with lock:
            taken[0] += n
            seen[tid] = (thread_nice(tid), thread_io_class(tid) if _IOPRIO_GET else None)
        return take(self, n)

    monkeypatch.setattr(TokenBucket, "take", watching)
    # 375 kB/s per connection, under the low-speed limit: the time the cap holds a connection back is not the
    # server being slow, so no part is dropped and fetched again.
    summary = warm(uri, tmp_path / "model", concurrency=4, max_bps=1.5e6, nice=7, low_speed_limit_bps=1e6,
                   low_speed_time_s=0.5)
    assert summary.ok and visible_files(tmp_path / "model") == files
    assert taken[0] == summary.downloaded_bytes == sum(map(len, files.values()))
    assert len(proxy.gets()) == sum(-(-len(b) // (512 * KiB)) for b in files.values() if b)
    assert seen and all(nice == max(7, main_nice) for nice, _ in seen.values())
    if _IOPRIO_GET:
        assert all(io_class == throttle.IOPRIO_CLASS_IDLE for _, io_class in seen.values())
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice  # the caller's thread is not


def test_nice_zero_leaves_the_thread_as_it_is():
    result = []

    def run():
        throttle.lower_thread_priority(0)
        result.append(thread_nice(threading.get_native_id()))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert result == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]
