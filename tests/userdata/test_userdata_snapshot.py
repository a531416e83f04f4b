"""AL2023 user data with engine snapshots on (spec.serving.snapshot): the seccomp profile, nodewarm-runc (the script
containerd's runc shim runs in runc's place, run here for real under sh) and the NodeConfig part that adds the
runtime; off, the user data is what it was before snapshots existed."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from nodewarm import profile
from nodewarm.api import snapshot
from nodewarm.bootstrap.launchrecord import RECORD_FILE
from nodewarm.karpenter import apis, drifthash as kh
from nodewarm.nodeclasses.render import node_user_data
from nodewarm.userdata import al2023
from nodewarm.userdata.al2023 import UNIT_NAME, render_part, render_script
from nodewarm.userdata.errors import UserDataInvalid
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm.userdata.merge import KARPENTER_NODECONFIG_RESERVE, USER_DATA_LIMIT, merge
from nodewarm.userdata.mime import NODE_CONFIG, SHELL_SCRIPT, Part, parse, serialize
from nodewarm.userdata.package import HANDLER_ENTRY
from support.builders import v

from support.userdata_parts import MOUNT, SHA, check_shell, heredoc
from support.userdata_parts import launch as _launch
SECCOMP_PATH = f"{snapshot.SECCOMP_DIR}/{snapshot.SECCOMP_PROFILE}"
GOLDEN = Path(__file__).parent / "golden" / "al2023-part.txt"
SH = shutil.which("sh")     # as containerd's shim runs the script: through its #!/bin/sh, with a PATH of its own


def launch(snapshot_on: bool = True, **overrides) -> BootstrapLaunch:
    return _launch(snapshot=snapshot_on, **overrides)


# --- off: nothing changes -------------------------------------------------------------------------------------------

def test_off_renders_byte_for_byte_what_it_did_before_snapshots():
    # golden/al2023-part.txt is render_part's output from the commit before snapshots reached the user data.
    assert render_part(launch(snapshot_on=False)) == GOLDEN.read_text()
    assert render_part(launch(snapshot_on=True)) != GOLDEN.read_text()


def test_snapshots_need_the_artifact_the_handler_runs_from():
    with pytest.raises(UserDataInvalid, match="BootstrapLaunch.snapshot"):
        BootstrapLaunch(profile="p", cache_mount=MOUNT, snapshot=True)


# --- the parts --------------------------------------------------------------------------------------------------------

def test_on_adds_a_nodeconfig_part_whose_containerd_toml_adds_the_runtime():
    parts = parse(render_part(launch()))
    assert [p.content_type for p in parts] == [SHELL_SCRIPT, NODE_CONFIG]
    assert all(p.is_nodewarm for p in parts)
    doc = yaml.safe_load(parts[1].content)
    assert doc["apiVersion"] == "node.eks.aws/v1alpha1" and doc["kind"] == "NodeConfig"
    assert set(doc["spec"]) == {"containerd"} and set(doc["spec"]["containerd"]) == {"config"}
    toml = tomllib.loads(doc["spec"]["containerd"]["config"])
    runtimes = toml["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    # Only the new runtime: the default runc runtime and everything else stay nodeadm's.
    assert list(toml) == ["plugins"] and list(runtimes) == [snapshot.RUNTIME_HANDLER]
    assert runtimes[snapshot.RUNTIME_HANDLER] == {
        "runtime_type": "io.containerd.runc.v2",
        # The rlimits of the stock runtime (nodeadm writes the file on every node), not containerd's defaults.
        "base_runtime_spec": "/etc/containerd/base-runtime-spec.json",
        # No Root: the shim's default is runc's own state root, where the agent's checkpoint looks.
        "options": {"BinaryName": snapshot.HANDLER_PATH, "SystemdCgroup": True},
    }
    assert parts[1].content.isascii()


def test_the_seccomp_profile_refuses_io_uring_and_allows_the_rest():
    written = json.loads(heredoc(render_script(launch()), SECCOMP_PATH))
    assert written == snapshot.SECCOMP
    assert written["defaultAction"] == "SCMP_ACT_ALLOW"
    assert written["syscalls"] == [{"names": ["io_uring_setup"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]


def test_the_handler_script_is_written_where_the_runtime_names_it():
    script = render_script(launch())
    handler = heredoc(script, snapshot.HANDLER_PATH)
    assert handler.startswith("#!/bin/sh\n")
    assert f"chmod 0755 {snapshot.HANDLER_PATH}" in script.splitlines()
    # Written before the unit starts, in the same part (containerd starts in nodeadm-run, after cloud-init).
    assert script.index(snapshot.HANDLER_PATH) < script.index(f"systemctl start --no-block {UNIT_NAME}")


def test_shell_syntax_and_shellcheck(tmp_path):
    from nodewarm.userdata.package import handler_entry

    script = render_script(launch())
    files = {"part.sh": ("bash", script), "nodewarm-runc": ("sh", heredoc(script, snapshot.HANDLER_PATH)),
             "snapshot-handler": ("sh", handler_entry("3.11"))}
    check_shell(files, tmp_path)


# --- nodewarm-runc, run for real -------------------------------------------------------------------------------------

SETTINGS = (snapshot.ENV_RUNC, snapshot.ENV_CRIU, snapshot.ENV_STORE, snapshot.ENV_BOOT)


def recorder(out: Path, rc: int) -> str:
    """A stand-in for runc and for the artifact's handler entry: writes what it was called as, with, and the
    handler's settings from its environment, then exits ``rc``."""
    settings = " ".join(f'"${{{name}-unset}}"' for name in SETTINGS)
    return f"#!/bin/sh\n{{ printf '%s\\n' \"$0\" \"$@\"; printf 'env %s\\n' {settings}; }} > {out}\nexit {rc}\n"


ARGV = ["--root", snapshot.RUNC_ROOT, "--log", "/run/x/log.json", "create", "--bundle", "/run/x/b",
        "--pid-file", "/run/x/pid", "ctr-1"]


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Node:
    """nodewarm-runc as rendered, with the artifact and state folders under tmp_path, a fake runc on PATH and,
    when asked, a fake artifact whose handler entry records how it was called."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.artifacts, self.state = tmp_path / "artifacts", tmp_path / "state"
        monkeypatch.setattr(al2023, "ARTIFACTS_DIR", str(self.artifacts))
        monkeypatch.setattr(al2023, "STATE_DIR", str(self.state))
        self.script = _executable(tmp_path / "nodewarm-runc", heredoc(render_script(launch()), snapshot.HANDLER_PATH))
        self.bin = tmp_path / "bin"
        self.runc = _executable(self.bin / "runc", recorder(tmp_path / "runc.out", 7))
        self.out = tmp_path

    def add_artifact(self) -> None:
        _executable(self.artifacts / SHA / HANDLER_ENTRY, recorder(self.out / "handler.out", 0))

    def run(self, argv: list[str], path: str | None = None) -> subprocess.CompletedProcess:
        env = {"PATH": str(self.bin) if path is None else path}
        return subprocess.run([SH, str(self.script), *argv], env=env, capture_output=True, text=True, timeout=30)

    def called(self, name: str) -> list[str] | None:
        f = self.out / f"{name}.out"
        return f.read_text().splitlines() if f.exists() else None


def test_without_the_artifact_every_call_goes_to_runc_unchanged(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    run = node.run(ARGV)
    assert run.returncode == 7, run.stderr                     # runc's own status comes back
    assert node.called("runc") == [str(node.runc), *ARGV, "env unset", "env unset", "env unset", "env unset"]
    assert node.called("handler") is None


def test_on_the_nvidia_ami_a_boot_goes_through_nvidia_container_runtime(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    nvidia = _executable(node.bin / "nvidia-container-runtime", recorder(tmp_path / "nvidia.out", 5))
    assert node.run(ARGV).returncode == 5
    assert node.called("nvidia")[: len(ARGV) + 1] == [str(nvidia), *ARGV] and node.called("runc") is None
    node.add_artifact()
    assert node.run(ARGV).returncode == 0
    said = node.called("handler")
    assert said[len(ARGV) + 1] == f"env {node.runc}" and said[-1] == f"env {nvidia}", said


def test_with_the_artifact_the_handler_runs_with_its_settings(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    node.add_artifact()
    run = node.run(ARGV)
    assert run.returncode == 0, run.stderr
    assert node.called("handler") == [str(node.artifacts / SHA / HANDLER_ENTRY), *ARGV,
                                      f"env {node.runc}", f"env {snapshot.CRIU_PATH}",
                                      f"env {snapshot.store_dir(MOUNT)}", f"env {node.runc}"]
    assert node.called("runc") is None                         # the handler decides; the script does not call runc


def test_after_a_failed_launch_calls_go_to_runc_even_with_the_artifact_unpacked(tmp_path, monkeypatch):
    # e.g. bin/nodewarm refused the artifact (another architecture, an older glibc): its interpreter cannot run.
    node = Node(tmp_path, monkeypatch)
    node.add_artifact()
    node.state.mkdir()
    (node.state / RECORD_FILE).write_text("reason=ArtifactRejected\nstatus=3\n\nglibc\n")
    assert node.run(ARGV).returncode == 7
    assert node.called("runc")[1:len(ARGV) + 1] == ARGV and node.called("handler") is None


def test_without_runc_on_path_it_says_so(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    run = node.run(ARGV, path=str(tmp_path / "empty"))
    assert run.returncode == 127 and "no runc on PATH" in run.stderr


# --- the part run in a scratch root -----------------------------------------------------------------------------------

def _rooted(script: str, root: Path) -> str:
    """The part with the absolute paths of its commands moved under ``root``; the files it writes (heredoc
    bodies) are left exactly as rendered."""
    out, inside = [], False
    for line in script.splitlines(keepends=True):
        if inside:
            inside = line != "NODEWARM_EOF\n"
        else:
            inside = line.rstrip("\n").endswith("<<'NODEWARM_EOF'")
            line = re.sub(r"(?<=[ >])/(var|etc|opt)/", f"{root}/\\1/", line)
        out.append(line)
    return "".join(out)


def test_the_part_writes_the_files_with_their_modes(tmp_path):
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)           # as on every AL2023 node
    fake = _executable(tmp_path / "bin" / "systemctl", "#!/bin/sh\n")
    script = render_script(launch())
    part = tmp_path / "part.sh"
    part.write_text(_rooted(script, root))
    # A umask that would leave the files unreadable: the part sets their modes itself.
    run = subprocess.run(["bash", "-c", f"umask 077 && exec bash {part}"], capture_output=True, text=True,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, timeout=30)
    assert run.returncode == 0, run.stderr

    def mode(path: str) -> int:
        return stat.S_IMODE((root / path.lstrip("/")).stat().st_mode)

    assert (root / snapshot.HANDLER_PATH.lstrip("/")).read_text() == heredoc(script, snapshot.HANDLER_PATH)
    assert json.loads((root / SECCOMP_PATH.lstrip("/")).read_text()) == snapshot.SECCOMP
    assert mode(snapshot.HANDLER_PATH) == 0o755
    assert mode(SECCOMP_PATH) == 0o644
    assert mode(os.path.dirname(SECCOMP_PATH)) == 0o755
    # Off, neither is written.
    off = tmp_path / "off"
    (off / "etc/systemd/system").mkdir(parents=True)
    part.write_text(_rooted(render_script(launch(snapshot_on=False)), off))
    subprocess.run(["bash", str(part)], env={"PATH": f"{fake.parent}:/usr/bin:/bin"}, check=True, timeout=30)
    assert (off / "opt/nodewarm/bin/nodewarm-launch").exists()
    assert not (off / snapshot.HANDLER_PATH.lstrip("/")).exists() and not (off / "var/lib/kubelet").exists()


# --- merge, budget, drift ---------------------------------------------------------------------------------------------

USER_NODECONFIG = """\
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  containerd:
    config: |
      [plugins."io.containerd.grpc.v1.cri".containerd]
      discard_unpacked_layers = false
"""


def test_merge_keeps_the_users_parts_and_both_of_ours_once():
    user = serialize([Part(SHELL_SCRIPT, "#!/bin/bash\necho mine"), Part(NODE_CONFIG, USER_NODECONFIG)])
    first = merge(user, render_part(launch()))
    parts = parse(first.user_data)
    assert [(p.content_type, p.is_nodewarm) for p in parts] == [
        (SHELL_SCRIPT, False), (NODE_CONFIG, False), (SHELL_SCRIPT, True), (NODE_CONFIG, True)]
    assert parts[1].content.rstrip("\n") == USER_NODECONFIG.rstrip("\n")
    again = merge(first.user_data, render_part(launch()))
    assert not again.added and again.user_data == first.user_data
    # Turned off: our NodeConfig goes, the user's stays.
    off = parse(merge(first.user_data, render_part(launch(snapshot_on=False))).user_data)
    assert [(p.content_type, p.is_nodewarm) for p in off] == [
        (SHELL_SCRIPT, False), (NODE_CONFIG, False), (SHELL_SCRIPT, True)]
    assert snapshot.HANDLER_PATH not in serialize(off)


def test_karpenters_nodeconfig_appended_last_keeps_ours():
    # Karpenter appends its generated NodeConfig (cluster, kubelet, taints): it sets no containerd config, and
    # nodeadm merges the containerd TOML of every NodeConfig part key by key.
    merged = merge(None, render_part(launch())).user_data
    karpenter = "# Karpenter Generated NodeConfig\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n" \
                "  cluster:\n    name: c\n"
    final = parse(serialize([*parse(merged), Part(NODE_CONFIG, karpenter)]))
    nodeconfigs = [yaml.safe_load(p.content) for p in final if p.content_type == NODE_CONFIG]
    assert len(nodeconfigs) == 2 and "containerd" in nodeconfigs[0]["spec"]
    assert "containerd" not in nodeconfigs[1]["spec"]


def test_snapshots_fit_the_user_data_budget():
    ours = render_part(launch())
    result = merge(None, ours)
    assert result.bytes_used == len(ours.encode()) + KARPENTER_NODECONFIG_RESERVE
    # Most of EC2's 16 KB stays the user's: what snapshots add is small.
    off = merge(None, render_part(launch(snapshot_on=False)))
    assert 0 < result.bytes_used - off.bytes_used < 2048
    assert result.budget_left == USER_DATA_LIMIT - result.bytes_used > 7000
    assert ours.isascii()


ENGINE_CHECK = {"enabled": True, "timeout": "8m", "image": "registry.example/vllm-nodewarm:0.21"}


def _nodeclass(**changes) -> dict:
    from nodewarm.nodeclasses.render import render
    from nodewarm import instancetypes

    p = profile.from_dict(v(spec__readiness__engineCheck=ENGINE_CHECK, **changes))
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    (nc,) = [d for d in render(p, types).documents if d["kind"] == "EC2NodeClass"]
    return nc


def test_turning_snapshots_on_or_off_drifts_the_pools_nodes():
    # The user data carries the runtime: Karpenter's EC2NodeClass hash changes and the nodes are replaced. Off is
    # the same hash as a profile that never had the field.
    never = _nodeclass()
    off = _nodeclass(spec__serving__snapshot={"enabled": False})
    on = _nodeclass(spec__serving__snapshot={"enabled": True})
    assert snapshot.HANDLER_PATH in on["spec"]["userData"] and snapshot.HANDLER_PATH not in off["spec"]["userData"]
    for version in apis.EC2NODECLASS_VERSIONS:
        assert kh.ec2nodeclass_hash(off, "ca", version) == kh.ec2nodeclass_hash(never, "ca", version)
        assert kh.ec2nodeclass_hash(on, "ca", version) != kh.ec2nodeclass_hash(off, "ca", version)


def test_the_controllers_merge_into_live_user_data_adds_the_runtime():
    p = profile.from_dict(v(spec__readiness__engineCheck=ENGINE_CHECK, spec__serving__snapshot={"enabled": True}))
    user_data, _ = node_user_data(p, None)
    assert [p.content_type for p in parse(user_data)][-2:] == [SHELL_SCRIPT, NODE_CONFIG]
