"""IAM policies, one per principal, each no wider than the S3 prefixes it needs.

* ``agent`` (reader): the bootstrap agent lists and reads every model's prefix (spec.model and spec.models) and the
  compile-cache prefix, and reads the launcher artifact. It is attached to the bootstrap DaemonSet's role (Pod
  Identity / IRSA) or, for the AL2023 host agent with ``spec.aws.identity: node``, to the node role. It never writes.
* ``publisher`` (writer, only with ``compileCache.publisher``): reads and writes the compile-cache prefix, and
  reads (never writes) every model's prefix: its ServiceAccount is the serving pods', and a vLLM container started
  on a node whose local copy is not complete streams the model from S3 (nodeclasses.servestart).
  Envelopes (the ``*.json`` pointers nodes trust) may only be written conditionally (``If-None-Match`` for the
  first writer, ``If-Match`` to replace a stale one), so a publisher can never blindly overwrite another's
  pointer; content-addressed blobs, claims, stale markers (``<key>.json.stale/<generation>``, after a miss
  proven in serving) and per-image runtime descriptors are plain puts. No delete anywhere.
* with ``spec.aws.kmsKeyArn``: decrypt for both on exactly that key, generate-data-key for the writer.
"""

from __future__ import annotations

from nodewarm.api import models
from nodewarm.api.warmprofile import WarmProfile


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return bucket, prefix


def _list(sid: str, bucket: str, prefix: str) -> dict:
    return {"Sid": sid, "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}}}


def _read_models(p: WarmProfile, read_actions: list[str]) -> list[dict]:
    """List and read every model of the profile (spec.model, then each of spec.models by its view). Sids are unique
    in a policy: the first model's keep their names, the n-th view's get n."""
    out = []
    for n, view in enumerate(models.views(p), start=1):
        b, prefix = _split(view.model.uri)
        suffix = "" if n == 1 else str(n)
        out += [_list(f"ListModel{suffix}", b, prefix),
                {"Sid": f"ReadModel{suffix}", "Effect": "Allow", "Action": list(read_actions),
                 "Resource": [f"arn:aws:s3:::{b}/{prefix}*"]}]
    return out


def agent_policy(p: WarmProfile) -> dict:
    cb, cp = _split(p.compile_cache.uri)
    statements = [
        *_read_models(p, ["s3:GetObject", "s3:GetObjectVersion"]),
        _list("ListCompileCache", cb, cp),
        {"Sid": "ReadCompileCache", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{cb}/{cp}*"]},
    ]
    if p.bootstrap.artifact_uri and not p.uses_daemonset:
        ab, ap = _split(p.bootstrap.artifact_uri)
        statements.append({"Sid": "ReadBootstrapArtifact", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [f"arn:aws:s3:::{ab}/{ap}"]})
    if p.aws.kms_key_arn:
        statements.append({"Sid": "DecryptWithBucketKey", "Effect": "Allow", "Action": ["kms:Decrypt"],
                           "Resource": [p.aws.kms_key_arn]})
    return {"Version": "2012-10-17", "Statement": statements}


def publisher_policy(p: WarmProfile) -> dict:
    cb, cp = _split(p.compile_cache.uri)
    root = f"arn:aws:s3:::{cb}/{cp}"
    statements = [
        _list("ListCompileCache", cb, cp),
        {"Sid": "ReadCompileCache", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{root}*"]},
        # vLLM in the same pod streams the model when the node's copy is not complete (servestart): read only. The
        # pods of every model share this ServiceAccount (identity.publisher_service_account), so every model.
        *_read_models(p, ["s3:GetObject"]),
        # Content-addressed archives, claims, stale markers and per-image runtime descriptors: never a pointer.
        {"Sid": "WriteBlobsClaimsMarkersRuntimes", "Effect": "Allow", "Action": ["s3:PutObject"],
         "Resource": [f"{root}*blobs/*", f"{root}*.json.claims/*", f"{root}*.json.stale/*", f"{root}runtimes/*"]},
        # The envelopes nodes trust: only a conditional write, so two publishers can never both win.
        {"Sid": "CreateEnvelopeIfAbsent", "Effect": "Allow", "Action": ["s3:PutObject"], "Resource": [f"{root}*.json"],
         "Condition": {"Null": {"s3:if-none-match": "false"}}},
        {"Sid": "ReplaceEnvelopeIfUnchanged", "Effect": "Allow", "Action": ["s3:PutObject"],
         "Resource": [f"{root}*.json"], "Condition": {"Null": {"s3:if-match": "false"}}},
    ]
    if p.aws.kms_key_arn:
        statements.append({"Sid": "EncryptWithBucketKey", "Effect": "Allow",
                           "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [p.aws.kms_key_arn]})
    return {"Version": "2012-10-17", "Statement": statements}


def policies(p: WarmProfile) -> dict[str, dict]:
    """{principal: policy}: ``agent`` always, ``publisher`` when the profile publishes compile caches."""
    out = {"agent": agent_policy(p)}
    if p.compile_cache.publisher:
        out["publisher"] = publisher_policy(p)
    return out
