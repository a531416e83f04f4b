"""The IAM policy the nodes' role needs: read the model prefix, read/write the compile-cache prefix."""

from __future__ import annotations

from nodewarm.profile import WarmProfile


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return bucket, prefix


def node_policy(p: WarmProfile) -> dict:
    mb, mp = _split(p.model.uri)
    cb, cp = _split(p.compile_cache.uri)
    statements = [
        {"Sid": "ListModel", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{mb}"],
         "Condition": {"StringLike": {"s3:prefix": [f"{mp}*"]}}},
        {"Sid": "ReadModel", "Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"],
         "Resource": [f"arn:aws:s3:::{mb}/{mp}*"]},
        {"Sid": "ListCompileCache", "Effect": "Allow", "Action": ["s3:ListBucket"],
         "Resource": [f"arn:aws:s3:::{cb}"], "Condition": {"StringLike": {"s3:prefix": [f"{cp}*"]}}},
        # PutObject covers the conditional (If-None-Match) first-writer-wins upload; no Delete: a node can
        # never remove a bundle another node published.
        {"Sid": "ReadWriteCompileCache", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": [f"arn:aws:s3:::{cb}/{cp}*"]},
    ]
    if p.bootstrap.artifact_uri:
        ab, ap = _split(p.bootstrap.artifact_uri)
        statements.append({"Sid": "ReadBootstrapArtifact", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [f"arn:aws:s3:::{ab}/{ap}"]})
    return {"Version": "2012-10-17", "Statement": statements}
