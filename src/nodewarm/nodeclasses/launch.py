"""WarmProfile -> how the node starts the agent (the user-data part, or the DaemonSet on Auto Mode)."""

from __future__ import annotations

from nodewarm.api.errors import ProfileError
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.userdata.launch import BootstrapLaunch


def bootstrap_launch(p: WarmProfile) -> BootstrapLaunch:
    """Only node-level facts: the profile's name, the NVMe mount, the pinned launcher artifact and whether the node
    carries the snapshot runtime. The agent reads everything else from the WarmProfile object at boot, so a serving
    change drifts no node (spec.serving.snapshot does: it changes the node's container runtime)."""
    b = p.bootstrap
    # The DaemonSet launcher runs nodewarm from its image; only the user-data launcher fetches the artifact.
    needs_artifact = p.nodes.mode == "karpenter" and not p.nodes.ami_alias.startswith("bottlerocket@")
    if needs_artifact and (not b.artifact_uri or not b.artifact_sha256):
        missing = "spec.bootstrap.artifactUri" if not b.artifact_uri else "spec.bootstrap.artifactSha256"
        raise ProfileError(missing, None, "run `nodewarm package`, upload the file it builds, and put its "
                                          "s3:// URI and sha256 here (nodes verify the sha256 before running it)")
    return BootstrapLaunch(
        profile=p.name,
        cache_mount=p.nodes.cache_mount,
        artifact_uri=b.artifact_uri if needs_artifact else None,
        artifact_sha256=b.artifact_sha256 if needs_artifact else None,
        # check_snapshot refuses it on the DaemonSet launchers, which could not install the runtime handler.
        snapshot=p.serving.snapshot and needs_artifact,
    )
