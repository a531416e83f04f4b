"""WarmProfile -> how the node starts the bootstrap (the user-data part, or the DaemonSet on Auto Mode)."""

from __future__ import annotations

import os

from nodewarm import __version__
from nodewarm.errors import ProfileError
from nodewarm.profile import WarmProfile
from nodewarm.userdata.launch import BootstrapLaunch

from .vllm import streamer_chunk_bytes


def region_of(p: WarmProfile) -> str:
    region = p.nodes.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ProfileError("spec.nodes.region", None, "set the cluster's AWS region (or export AWS_REGION)")
    return region


def bootstrap_launch(p: WarmProfile) -> BootstrapLaunch:
    b = p.bootstrap
    # The DaemonSet launcher runs nodewarm from its image; only the user-data launcher fetches the artifact.
    needs_artifact = p.nodes.mode == "karpenter" and not p.nodes.ami_alias.startswith("bottlerocket@")
    if needs_artifact and (not b.artifact_uri or not b.artifact_sha256):
        missing = "spec.bootstrap.artifactUri" if not b.artifact_uri else "spec.bootstrap.artifactSha256"
        raise ProfileError(missing, None, "run `nodewarm package`, upload the file it builds, and put its "
                                          "s3:// URI and sha256 here (nodes verify the sha256 before running it)")
    return BootstrapLaunch(
        # Only where it is fetched: a DaemonSet given the artifact's pin would skip its (torch) load check.
        artifact_uri=b.artifact_uri if needs_artifact else None,
        artifact_sha256=b.artifact_sha256 if needs_artifact else None,
        profile=p.name,
        model_uri=p.model.uri,
        dest_dir=p.warm_dir,
        compile_cache_uri=p.compile_cache.uri,
        mode=p.nodes.mode,
        cache_mount=p.nodes.cache_mount,
        region=region_of(p),
        nodewarm_version=__version__,
        cache_key_args=cache_key_args(p),
        # The load check streams the weights as the vLLM pod's loader will (nodeclasses.vllm).
        streamer_concurrency=p.concurrency,
        streamer_chunk_bytes=streamer_chunk_bytes(p),
    )


def cache_key_args(p: WarmProfile) -> tuple[str, ...]:
    """What the node's compile-cache key needs from the profile, as `bootstrap run` options. The model
    string is the path vLLM is started with, so it is derived on the node from the profile name."""
    args = list(serving_spec_args(p))
    if p.compile_cache.verify_key:
        args += ["--verify-key", p.compile_cache.verify_key]
    return tuple(args)


def serving_spec_args(p: WarmProfile) -> tuple[str, ...]:
    """The serving spec options shared by `bootstrap run` (restore) and `publish`: both must build the
    same key from the same profile, so both take them from here."""
    s = p.serving
    args = ["--tp", str(s.tensor_parallel_size), "--engine-arg", f"dtype={s.dtype}"]
    if s.max_model_len:
        args += ["--engine-arg", f"max_model_len={s.max_model_len}"]
    if p.model.revision:
        args += ["--revision", p.model.revision]
    if s.image:
        args += ["--image", s.image]
    return tuple(args)
