"""WarmProfile -> how the node starts the agent (the user-data part, or the DaemonSet on Auto Mode), and the
serving spec the agent and the publisher build the compile-cache key from."""

from __future__ import annotations

from nodewarm.errors import ProfileError
from nodewarm.profile import WarmProfile
from nodewarm.userdata.launch import BootstrapLaunch

from .podlayout import model_path


def bootstrap_launch(p: WarmProfile) -> BootstrapLaunch:
    """Only node-level facts: the profile's name, the NVMe mount and the pinned launcher artifact. The agent
    reads everything else from the WarmProfile object at boot, so a serving change drifts no node."""
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
    )


def serving_engine(p: WarmProfile) -> dict[str, str]:
    s = p.serving
    engine = {"dtype": s.dtype}
    if s.max_model_len:
        engine["max_model_len"] = str(s.max_model_len)
    return engine


def serving_spec_args(p: WarmProfile) -> tuple[str, ...]:
    """The serving spec as `publish` options. The node agent builds the same spec from the same profile
    (nodewarm.bootstrap.profilesource), so publisher and node agree on the compile-cache key."""
    s = p.serving
    args = ["--tp", str(s.tensor_parallel_size)]
    for k, v in serving_engine(p).items():
        args += ["--engine-arg", f"{k}={v}"]
    if p.model.revision:
        args += ["--revision", p.model.revision]
    if s.image:
        args += ["--image", s.image]
    return tuple(args)


def serving_spec(p: WarmProfile):
    """The compile-cache key's serving spec, as the node agent uses it (the model string is the path vLLM is
    started with)."""
    from nodewarm.bootstrap.compilecache import cachekey

    return cachekey.ServingSpec(model=model_path(p.name), revision=p.model.revision,
                                tp=p.serving.tensor_parallel_size, image=p.serving.image, engine=serving_engine(p))
