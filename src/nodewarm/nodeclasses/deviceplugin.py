"""The patch that lets a device plugin DaemonSet start on a warming node (`nodewarm render --device-plugin-patch`).

A device plugin must run while the node still carries the startup taint, or the node advertises no GPUs until
the taint lifts and the vLLM pod waits a second time (the controller, nodewarm.controller, finds such DaemonSets
and names them on the WarmProfile's ``DevicePluginsTolerate`` condition). The fix is one toleration.

It is a JSON patch that appends, not a strategic-merge patch: a Pod spec's ``tolerations`` list has no merge key,
so a strategic-merge (or merge) patch would replace the whole list and drop the toleration the plugin already
has for ``nvidia.com/gpu``.
"""

from __future__ import annotations

import json
import shlex


def toleration(taint_key: str) -> dict:
    return {"key": taint_key, "operator": "Exists", "effect": "NoSchedule"}


def json_patch(taint_key: str, has_tolerations: bool = True) -> list[dict]:
    """Append the toleration (``has_tolerations``), or create the list with it (a DaemonSet that has none)."""
    if has_tolerations:
        return [{"op": "add", "path": "/spec/template/spec/tolerations/-", "value": toleration(taint_key)}]
    return [{"op": "add", "path": "/spec/template/spec/tolerations", "value": [toleration(taint_key)]}]


def parse_target(target: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` (``NAME`` alone: kube-system, where the EKS add-on and NVIDIA's manifest put it)."""
    ns, _, name = target.rpartition("/")
    return (ns or "kube-system"), name


def commands(target: str, taint_key: str) -> str:
    """A shell snippet: the kubectl patch for a DaemonSet with tolerations, and the one for a DaemonSet without."""
    ns, name = parse_target(target)
    cmd = lambda ops: (f"kubectl -n {shlex.quote(ns)} patch daemonset {shlex.quote(name)} --type=json "  # noqa: E731
                       f"-p {shlex.quote(json.dumps(ops, separators=(',', ':')))}")
    return (f"# DaemonSet {ns}/{name} (a device plugin) must tolerate the startup taint {taint_key}:NoSchedule, or the\n"
            "# node advertises no nvidia.com/gpu until the taint lifts and the vLLM pod waits a second time.\n"
            "# Appends the toleration (a JSON patch: a strategic-merge patch would replace the plugin's own list):\n"
            f"{cmd(json_patch(taint_key, True))}\n"
            "# If the DaemonSet has no tolerations at all, that fails (the list does not exist); then:\n"
            f"# {cmd(json_patch(taint_key, False))}\n"
            "# Installed with Helm or the GPU operator: put the toleration in its values (`tolerations`,\n"
            "# `devicePlugin.tolerations`...) as well, or the next upgrade drops it:\n"
            f"#   {json.dumps(toleration(taint_key), separators=(', ', ': '))}\n")
