"""Prove the compile-cache hit: did serving reuse the restored cache, or compile again?

A silent miss is the main failure: the bundle restores fine, vLLM computes another hash (a flag or an
env var we did not key on), compiles for a minute, and nobody notices. So after serving starts we
compare the cache trees with the snapshot taken right after the restore and read vLLM's log:

* a new vLLM hash dir           -> miss (vLLM keyed the run differently from the bundle)
* a restored vLLM artifact written again -> miss (vLLM could not load it and compiled: e.g. its AOT ``model``
  file, which vLLM 0.32 on CPU fails to load and then saves anew under the same name)
* new FX graphs or kernels      -> miss (Inductor recompiled)
* only a new precompiled header -> miss (graphs hit, but ~5 s of gcc on CPU)
* vLLM log says it compiled     -> miss
* vLLM log / counters say loaded from cache, and nothing new on disk -> hit
* serving became ready (``served``) and wrote no compiled output after a restore -> hit
* no evidence either way        -> unknown (e.g. vLLM's cache is not where we looked)

``snapshot`` and ``read_log`` do the I/O; ``judge`` is pure.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

Status = Literal["hit", "miss", "unknown"]

_AOT_DIR = "torch_aot_compile"
_GRAPH_DIRS = frozenset({"fxgraph", "aotautograd"})
_KERNEL_SUFFIXES = (".so", ".cubin", ".hsaco", ".ptx", ".spv", ".gch")
_VLLM_ARTIFACT = re.compile(r"^(model|vllm_compile_cache\.py|computation_graph\.py|artifact_compile_range_.*)$")

# vLLM 0.32 log lines (vllm/compilation/decorators.py, backends.py).
_LOG_HIT = re.compile(r"Directly load AOT compilation from path|Directly load the compiled graph")
_LOG_COMPILED = re.compile(r"Compiling a graph for compile range|saved AOT compiled function to")
_LOG_AOT_FAILED = re.compile(r"Compiling model again due to a load failure|Cannot load aot compilation from path")
_LOG_HASH = re.compile(r"torch_compile_cache/(?:torch_aot_compile/([0-9a-f]{64})|([0-9a-f]{10}))/rank_")


@dataclass(frozen=True)
class TreeSnapshot:
    """What compiled output is on disk: vLLM hash dirs, FX graph keys, compiled artifacts (and when each was last
    written: a file compiled again under the same name is a different file)."""

    hash_dirs: frozenset[str] = frozenset()
    graphs: frozenset[str] = frozenset()
    artifacts: frozenset[str] = frozenset()
    written: Mapping[str, int] = field(default_factory=dict, compare=False)   # artifact -> st_mtime_ns

    def to_dict(self) -> dict[str, Any]:
        return {"hash_dirs": sorted(self.hash_dirs), "graphs": sorted(self.graphs), "artifacts": sorted(self.artifacts),
                "written": dict(sorted(self.written.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TreeSnapshot":
        # "written" is absent from an older agent's baseline: rewrites are then not seen, new files still are.
        return cls(frozenset(d.get("hash_dirs", ())), frozenset(d.get("graphs", ())), frozenset(d.get("artifacts", ())),
                   {str(k): int(v) for k, v in (d.get("written") or {}).items()})

    def rewritten(self, baseline: "TreeSnapshot") -> frozenset[str]:
        """Artifacts present in both whose file was written again since ``baseline``."""
        return frozenset(a for a in self.artifacts & baseline.artifacts
                         if a in self.written and a in baseline.written and self.written[a] != baseline.written[a])


@dataclass(frozen=True)
class LogEvidence:
    loaded: int = 0
    compiled: int = 0
    aot_failed: int = 0
    hash_dirs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HitResult:
    status: Status
    reason: str                 # CamelCase, for the Node condition / Event reason
    message: str
    new_hash_dirs: tuple[str, ...] = ()
    new_graphs: tuple[str, ...] = ()
    new_artifacts: int = 0
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "message": self.message,
                "newHashDirs": list(self.new_hash_dirs), "newGraphs": list(self.new_graphs),
                "newArtifacts": self.new_artifacts, "evidence": list(self.evidence)}


def _classify(root: str, rel: tuple[str, ...]) -> tuple[str | None, str | None, bool]:
    """(hash dir, graph key, is compiled artifact) for one file path under a cache root."""
    hash_dir = graph = None
    if root == "vllm" and len(rel) > 1:
        # AOT layout: torch_aot_compile/<sha256>/...; non-AOT: <hash10>/rank_x_y/...
        if rel[0] == _AOT_DIR:
            hash_dir = "/".join(rel[:2]) if len(rel) > 2 else None
        else:
            hash_dir = rel[0]
    for i, part in enumerate(rel[:-1]):
        if part == "fxgraph" and len(rel) > i + 3:
            graph = rel[i + 2]  # fxgraph/<2 chars>/<key>/<entry>
    name = rel[-1]
    artifact = (
        any(p in _GRAPH_DIRS for p in rel[:-1])
        or name.endswith(_KERNEL_SUFFIXES)
        or root == "triton"
        or (root == "vllm" and any(p.startswith("rank_") for p in rel[:-1]) and bool(_VLLM_ARTIFACT.match(name)))
    )
    return hash_dir, graph, artifact


def snapshot(roots: Mapping[str, Path]) -> TreeSnapshot:
    """Scan the cache roots (name -> dir, as in bundle.CacheDirs.roots()); missing roots are empty."""
    hash_dirs, graphs, artifacts, written = set(), set(), set(), {}
    for root, path in roots.items():
        path = Path(path)
        for dirpath, _dirs, files in os.walk(path):
            for f in files:
                rel = (Path(dirpath) / f).relative_to(path).parts
                h, g, a = _classify(root, rel)
                if h:
                    hash_dirs.add(h)
                if g:
                    graphs.add(g)
                if a:
                    name = f"{root}/" + "/".join(rel)
                    artifacts.add(name)
                    try:
                        written[name] = os.stat(os.path.join(dirpath, f), follow_symlinks=False).st_mtime_ns
                    except OSError:     # removed while we walked: still listed, never "rewritten"
                        pass
    return TreeSnapshot(frozenset(hash_dirs), frozenset(graphs), frozenset(artifacts), written)


def scan_log(text: str) -> LogEvidence:
    hashes = {a or b for a, b in _LOG_HASH.findall(text)}
    return LogEvidence(
        loaded=len(_LOG_HIT.findall(text)),
        compiled=len(_LOG_COMPILED.findall(text)),
        aot_failed=len(_LOG_AOT_FAILED.findall(text)),
        hash_dirs=frozenset(hashes),
    )


def _short(names, n: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def judge(baseline: TreeSnapshot, current: TreeSnapshot, *, restored: bool,
          log: LogEvidence | None = None, counters: Mapping[str, int] | None = None, served: bool = False) -> HitResult:
    """Decide hit or miss from what changed on disk since the restore, vLLM's log and Inductor counters."""
    log = log or LogEvidence()
    counters = counters or {}
    new_hash = tuple(sorted(current.hash_dirs - baseline.hash_dirs))
    new_graphs = tuple(sorted(current.graphs - baseline.graphs))
    new_artifacts = current.artifacts - baseline.artifacts
    rewritten = current.rewritten(baseline)
    fx_hits = sum(v for k, v in counters.items() if k.endswith("fxgraph_cache_hit"))
    fx_misses = sum(v for k, v in counters.items() if k.endswith("fxgraph_cache_miss"))
    evidence = [f"new hash dirs: {len(new_hash)}", f"new FX graphs: {len(new_graphs)}",
                f"new compiled artifacts: {len(new_artifacts)}", f"rewritten compiled artifacts: {len(rewritten)}"]
    if log != LogEvidence():
        evidence.append(f"vLLM log: loaded={log.loaded} compiled={log.compiled} aot_load_failed={log.aot_failed}")
    if counters:
        evidence.append(f"inductor counters: fxgraph_cache_hit={fx_hits} fxgraph_cache_miss={fx_misses}")
    common = dict(new_hash_dirs=new_hash, new_graphs=new_graphs, new_artifacts=len(new_artifacts),
                  evidence=tuple(evidence))

    if not restored and (new_hash or new_graphs or new_artifacts or rewritten or log.compiled or fx_misses):
        return HitResult("miss", "ColdCompile", "no compile cache was restored, so serving compiled from scratch",
                         **common)
    if new_hash:
        had = _short(baseline.hash_dirs) or "none"
        return HitResult("miss", "NewHashDir", f"vLLM compiled into new cache dir(s) {_short(new_hash)}; the bundle "
                         f"has {had}: a vLLM flag or env var differs from the bundle's and is not in its key", **common)
    vllm_rewritten = sorted(a for a in rewritten if a.startswith("vllm/"))
    if vllm_rewritten:
        return HitResult("miss", "VllmRecompiled", f"vLLM wrote its restored compiled artifact(s) again "
                         f"({_short(vllm_rewritten)}): it could not load them and compiled (vLLM's log says why, e.g. "
                         "'Compiling model again due to a load failure')", **common)
    if new_artifacts and all(a.startswith("pch/") for a in new_artifacts) and not (new_graphs or fx_misses or rewritten):
        return HitResult("miss", "HeaderRebuilt", "graphs and kernels came from the cache, but Inductor rebuilt "
                         "its precompiled C++ header (~5 s on CPU): restore the pch root too "
                         "($TMPDIR/torchinductor_$USER/precompiled_headers of the serving process)", **common)
    if new_graphs or new_artifacts or rewritten or fx_misses:
        what = (f"{len(new_graphs)} new FX graph(s)" if new_graphs else
                f"{len(new_artifacts | rewritten)} new or rewritten compiled artifact(s)")
        if fx_misses and not (new_graphs or new_artifacts):
            what = f"{fx_misses} FX graph cache miss(es)"
        return HitResult("miss", "InductorRecompiled", f"Inductor compiled again ({what}) although the bundle was "
                         "restored: a shape, config or runtime factor differs", **common)
    if log.aot_failed:
        return HitResult("miss", "AotLoadFailed", "vLLM could not load the AOT artifact and recompiled the model "
                         "(Inductor entries were reused)", **common)
    if log.compiled:
        return HitResult("miss", "VllmCompiled", "vLLM's log shows a compile although nothing new is on disk: "
                         "is its cache dir the one we restored into?", **common)
    if log.loaded or fx_hits:
        return HitResult("hit", "CompileCacheHit", "serving loaded compiled graphs from the restored cache; "
                         "nothing was recompiled", **common)
    if served and restored:
        # vLLM compiles before its health endpoint answers: ready with nothing new on disk means it loaded.
        return HitResult("hit", "CompileCacheHit", "vLLM became ready without writing any compiled output: it "
                         "loaded everything from the restored cache", **common)
    return HitResult("unknown", "NoCompileActivity", "no compile activity seen in the cache dirs or the log: "
                     "check that vLLM uses the restored cache dir and that the log was given", **common)


def read_log(path: Path, limit: int = 64 << 20) -> LogEvidence:
    """Scan the last ``limit`` bytes of a vLLM log file."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return scan_log(f.read().decode(errors="replace"))


@dataclass(frozen=True)
class Baseline:
    """What the node agent saw right after its restore: the snapshot and which bundle it restored."""

    snapshot: TreeSnapshot
    restored: bool
    reason: str = ""              # the restore's reason (Restored, CacheNotFound, CacheKeyMismatch...)
    envelope_key: str = ""        # the restored bundle's envelope ("" when cold)
    generation: int = 0


def save_baseline(path: Path, baseline: Baseline) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"restored": baseline.restored, "reason": baseline.reason,
                               "envelopeKey": baseline.envelope_key, "generation": baseline.generation,
                               "snapshot": baseline.snapshot.to_dict()}, indent=1))
    os.replace(tmp, path)


def load_baseline(path: Path) -> Baseline:
    doc = json.loads(Path(path).read_text())
    return Baseline(TreeSnapshot.from_dict(doc["snapshot"]), bool(doc["restored"]), str(doc.get("reason", "")),
                    str(doc.get("envelopeKey", "")), int(doc.get("generation", 0)))


def verify_hit(roots: Mapping[str, Path], baseline: TreeSnapshot, *, restored: bool,
               log_path: Path | None = None, counters: Mapping[str, int] | None = None) -> HitResult:
    """Snapshot the cache roots now and judge against the post-restore baseline."""
    evidence = read_log(log_path) if log_path else None
    return judge(baseline, snapshot(roots), restored=restored, log=evidence, counters=counters)
