"""The offline instance table must agree with EC2's DescribeInstanceTypes data (as shipped by moto)."""

from __future__ import annotations

import boto3
from moto import mock_aws

from nodewarm import instancetypes


def test_offline_table_matches_describe_instance_types(monkeypatch):
    # moto intercepts requests to AWS; an endpoint pointing at a local S3 server would bypass it.
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(var, raising=False)
    table = instancetypes.offline_table()
    with mock_aws():
        live = instancetypes.lookup(sorted(table), "ec2", boto3.client("ec2", region_name="us-east-1"))
    assert set(live) == set(table)
    mismatches = {n: (table[n], live[n]) for n in table if table[n] != live[n]}
    assert not mismatches


def test_from_describe_ignores_non_nvme_storage():
    item = {"InstanceType": "x.large", "InstanceStorageInfo": {"TotalSizeInGB": 100, "NvmeSupport": "unsupported"},
            "GpuInfo": {"Gpus": [{"Name": "T4", "Count": 1, "MemoryInfo": {"SizeInMiB": 16384}}]}}
    assert instancetypes.from_describe(item).nvme_gb == 0
