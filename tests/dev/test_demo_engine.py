"""The demo's reading of a real vLLM pod's log and its publisher sidecar's (pure: no vLLM is started here; the
real-vLLM demo run is tests/dev/test_demo.py)."""

from __future__ import annotations

import json
import os

from nodewarm_dev.demo import engine

START_LOCAL = json.dumps({"ts": "2026-12-01T21:18:26Z", "level": "info", "logger": "nodewarm.serve_start",
                          "event": "serve_start.local", "path": "local", "reason": "local copy complete"})
START_S3 = json.dumps({"ts": "2026-12-01T21:18:26Z", "level": "warning", "logger": "nodewarm.serve_start",
                       "event": "serve_start.s3", "path": "s3", "reason": "local copy not complete"})
STREAMED = "Loading safetensors using Runai Model Streamer: 100% Completed | 39/39 [00:00<00:00, 1447.62it/s]"
INIT = "(EngineCore pid=2369) INFO 12-01 21:20:38 [core.py:402] init engine (profile, create kv cache, warmup model) took 57.61 s"
HIT = "I1201 21:30:01.000000 2369 torch/_inductor/codecache.py:1] [0/0] fx graph cache hit for key fabc123"
MISS = "I1201 21:30:01.000000 2369 torch/_inductor/codecache.py:1] [0/0] fx graph cache miss for key fdef456"
AOT_FAIL = ("WARNING 12-01 21:20:00 [decorators.py:334] Compiling model again due to a load failure from "
            "/compile-cache/vllm/torch_compile_cache/torch_aot_compile/x/rank_0_0/model, reason: 'function' object "
            "has no attribute 'finalize_loading'")


def test_a_warm_pod_that_loaded_every_graph_from_the_cache():
    ev = engine.evidence("\n".join([START_LOCAL, STREAMED, HIT, HIT, INIT]))
    assert (ev.start_path, ev.streamed, ev.verdict()) == ("local", True, "loaded")
    assert ev.engine.init_s == 57.61 and len(ev.engine.fx_hits) == 2
    assert ev.to_dict()["verdict"] == "loaded" and ev.to_dict()["startPath"] == "local"


def test_a_compile_is_no_hit_and_an_aot_load_failure_is_a_recompile_even_with_cache_hits():
    assert engine.evidence("\n".join([START_S3, STREAMED, MISS, INIT])).verdict() == "compiled"
    assert engine.evidence("\n".join([START_LOCAL, HIT, MISS])).verdict() == "compiled"
    assert engine.evidence("\n".join([START_LOCAL, AOT_FAIL, HIT])).verdict() == "recompiled"
    # Nothing logged about the compile (e.g. TORCH_LOGS not set): no claim either way.
    assert engine.evidence(START_LOCAL).verdict() == "unknown"
    assert engine.evidence("").start_path is None


def test_the_publisher_lines_the_demo_waits_for():
    verdict = {"event": "compilecache.served", "outcome": "hit", "reason": "NothingCompiled"}
    done = {"event": "compilecache.publish.done", "status": "published", "envelope_key": "k"}
    text = "\n".join(["nodewarm: starting", json.dumps({"event": "compilecache.publish.watching"}),
                      json.dumps(verdict), "{not json", json.dumps(done)])
    assert engine.publisher_verdict(text) == verdict and engine.publisher_published(text) == done
    assert engine.publisher_verdict("hit: x: y") is None and engine.publisher_published("") is None
    # The demo waits for the verdict's write on the Node, not for the verdict line: a sidecar stopped between the
    # two leaves the Node without its outcome (seen in a clean clone's run: the Node said nothing, the log said hit).
    assert engine.publisher_reported(text) is None
    reported = {"event": "compile_cache.reported", "node": "n", "outcome": "hit", "reason": "CompileCacheHit"}
    assert engine.publisher_reported("\n".join([text, json.dumps(reported)])) == reported
    lost = {"event": "compilecache.publish.lost", "envelope_key": "k"}
    assert engine.publisher_published(json.dumps(lost)) == lost


def test_the_runtime_env_is_the_cpu_nodes_and_never_the_rendered_pods():
    from nodewarm import instancetypes
    from nodewarm_dev.demo.run import demo_profile
    from nodewarm.nodeclasses import vllm

    p = demo_profile(0.005, "sqi2y4EF5DUe4tvT2+E1ukFBrgNZFtMt1RlHP1CH1N8=", 1, "vllm", 18123)
    rendered = {e["name"] for c in vllm.pod_spec(p, instancetypes.lookup(list(p.nodes.instance_types)))["containers"]
                for e in c["env"]}
    assert set(engine.NODE_RUNTIME_ENV) and not set(engine.NODE_RUNTIME_ENV) & rendered
    # The demo's profile gives the start script its cold path (credentials may read the model) and a publisher.
    c = vllm.deployment(p)["spec"]["template"]["spec"]["containers"]
    assert [x["name"] for x in c] == [engine.VLLM_CONTAINER, engine.PUBLISHER_CONTAINER]
    assert c[0]["command"][c[0]["command"].index("--cold") + 1] == "stream" and "--port=18123" in c[0]["args"]


def test_group_rss_counts_this_process_group():
    assert engine.group_rss({os.getpgrp()}) > 0
    assert engine.group_rss({2**30}) == 0
