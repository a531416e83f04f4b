#!/usr/bin/env python
"""The node agent's compile-cache phase in a fresh process: what it costs and what it imports.

Used by tests/bootstrap/compilecache/test_publish_restore.py (the phase imports no torch) and
bench/compile_cache.py (its seconds).
A fresh process because a test or bench process has long imported torch for its own use. It imports what
the agent imports, makes the S3 client the weights phase makes before this one (so botocore's state is
what the phase finds in the agent), then restores the first model's bundle as the agent's compile-cache phase
does, through the AgentConfig's Warmer (modelcache/warmer.py). A finder placed first on sys.meta_path records
every attempt to import torch, triton or vLLM, also one that fails because the package is absent (the AL2023 host
agent has no torch, and a guarded import there would hide the dependency).

    python -m nodewarm_dev.testenv.restore_probe CONFIG.json

CONFIG: {"uri", "verify_key", "mount", "spec": {ServingSpec fields}, "host_root", "node_labels"}. Prints one
line, ``RESULT:{json}``: status, reason, seconds (the phase), files, bytes, imported and attempted (the
watched packages found in sys.modules at the end / asked for at any point).
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time

WATCHED = ("torch", "triton", "vllm")


class ImportRecorder(importlib.abc.MetaPathFinder):
    """Notes the watched top-level packages (and their submodules) anyone asks for; finds nothing itself."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in WATCHED:
            self.asked.add(fullname)
        return None


def main() -> None:
    recorder = ImportRecorder()
    sys.meta_path.insert(0, recorder)

    from pathlib import Path

    from nodewarm.bootstrap.agent import AgentConfig
    from nodewarm.api.servingspec import ServingSpec
    from nodewarm.bootstrap.s3client import make_client

    doc = json.loads(Path(sys.argv[1]).read_text())
    mount = Path(doc["mount"])
    cfg = AgentConfig(profile="restore-probe", model_uri="", dest=mount / "model", mount=mount,
                      node_name="restore-probe", compile_cache_uri=doc["uri"], verify_key=doc["verify_key"],
                      spec=ServingSpec(**doc["spec"]), host_root=Path(doc.get("host_root", "/")),
                      node_labels=doc.get("node_labels", {}))
    make_client(4, 5, 60)   # the weights phase's, made before the compile-cache phase in the agent
    start = time.perf_counter()
    result = cfg.warmer().compile_cache(cfg.first_model())
    seconds = time.perf_counter() - start
    print("RESULT:" + json.dumps({
        "status": result.status, "reason": result.reason, "message": result.message,
        "seconds": round(seconds, 4), "files": result.files, "bytes": result.bytes,
        "imported": sorted(m for m in WATCHED if m in sys.modules), "attempted": sorted(recorder.asked),
    }), flush=True)


if __name__ == "__main__":
    main()
