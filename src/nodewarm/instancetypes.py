"""Instance facts nodewarm sizes against: NVMe instance-store capacity, GPUs, vCPUs and memory.

EC2 ``DescribeInstanceTypes`` (``InstanceStorageInfo.TotalSizeInGB``, ``GpuInfo``) is the authority and
is used whenever AWS is reachable. The offline table covers the common GPU types so ``render`` works
without credentials; a test checks it against the EC2 data shipped with moto so it cannot rot silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    nvme_gb: int          # TotalSizeInGB, decimal GB, all instance-store disks together (0 = none)
    gpus: int
    gpu_name: str
    gpu_memory_mib: int
    vcpus: int = 0
    memory_mib: int = 0

    @property
    def nvme_bytes(self) -> int:
        return self.nvme_gb * 10**9


# name: (TotalSizeInGB, GPU count, GPU name, MiB per GPU, vCPUs, MiB of memory). NVMe instance store is
# "required" on all of them.
_OFFLINE: dict[str, tuple[int, int, str, int, int, int]] = {
    "g4dn.xlarge": (125, 1, "T4", 16384, 4, 16384), "g4dn.2xlarge": (225, 1, "T4", 16384, 8, 32768),
    "g4dn.4xlarge": (225, 1, "T4", 16384, 16, 65536), "g4dn.8xlarge": (900, 1, "T4", 16384, 32, 131072),
    "g4dn.12xlarge": (900, 4, "T4", 16384, 48, 196608), "g4dn.16xlarge": (900, 1, "T4", 16384, 64, 262144),
    "g4dn.metal": (1800, 8, "T4", 16384, 96, 393216),
    "g5.xlarge": (250, 1, "A10G", 22888, 4, 16384), "g5.2xlarge": (450, 1, "A10G", 22888, 8, 32768),
    "g5.4xlarge": (600, 1, "A10G", 22888, 16, 65536), "g5.8xlarge": (900, 1, "A10G", 22888, 32, 131072),
    "g5.12xlarge": (3800, 4, "A10G", 22888, 48, 196608), "g5.16xlarge": (1900, 1, "A10G", 22888, 64, 262144),
    "g5.24xlarge": (3800, 4, "A10G", 22888, 96, 393216), "g5.48xlarge": (7600, 8, "A10G", 22888, 192, 786432),
    "g6.xlarge": (250, 1, "L4", 22888, 4, 16384), "g6.2xlarge": (450, 1, "L4", 22888, 8, 32768),
    "g6.4xlarge": (600, 1, "L4", 22888, 16, 65536), "g6.8xlarge": (900, 1, "L4", 22888, 32, 131072),
    "g6.12xlarge": (3760, 4, "L4", 22888, 48, 196608), "g6.16xlarge": (1880, 1, "L4", 22888, 64, 262144),
    "g6.24xlarge": (3760, 4, "L4", 22888, 96, 393216), "g6.48xlarge": (7520, 8, "L4", 22888, 192, 786432),
    "g6e.xlarge": (250, 1, "L40S", 45776, 4, 32768), "g6e.2xlarge": (450, 1, "L40S", 45776, 8, 65536),
    "g6e.4xlarge": (600, 1, "L40S", 45776, 16, 131072), "g6e.8xlarge": (900, 1, "L40S", 45776, 32, 262144),
    "g6e.12xlarge": (3800, 4, "L40S", 45776, 48, 393216), "g6e.16xlarge": (1900, 1, "L40S", 45776, 64, 524288),
    "g6e.24xlarge": (3800, 4, "L40S", 45776, 96, 786432), "g6e.48xlarge": (7600, 8, "L40S", 45776, 192, 1572864),
    "p4d.24xlarge": (8000, 8, "A100", 40960, 96, 1179648), "p4de.24xlarge": (8000, 8, "A100", 81920, 96, 1179648),
    "p5.4xlarge": (3800, 1, "H100", 81920, 16, 262144), "p5.48xlarge": (30400, 8, "H100", 81920, 192, 2097152),
    "p5e.48xlarge": (30400, 8, "H200", 144384, 192, 2097152), "p5en.48xlarge": (30400, 8, "H200", 144384, 192, 2097152),
    "p6-b200.48xlarge": (30400, 8, "B200", 183359, 192, 2097152),
}


def offline_table() -> dict[str, InstanceType]:
    return {n: InstanceType(n, *v) for n, v in _OFFLINE.items()}


def from_describe(item: dict) -> InstanceType:
    """One element of DescribeInstanceTypes' ``InstanceTypes`` list."""
    storage = item.get("InstanceStorageInfo") or {}
    nvme = storage.get("TotalSizeInGB", 0) if storage.get("NvmeSupport") in ("required", "supported") else 0
    gpus = (item.get("GpuInfo") or {}).get("Gpus") or []
    return InstanceType(
        name=item["InstanceType"],
        nvme_gb=int(nvme),
        gpus=sum(g["Count"] for g in gpus),
        gpu_name=gpus[0]["Name"] if gpus else "",
        gpu_memory_mib=gpus[0]["MemoryInfo"]["SizeInMiB"] if gpus else 0,
        vcpus=(item.get("VCpuInfo") or {}).get("DefaultVCpus", 0),
        memory_mib=(item.get("MemoryInfo") or {}).get("SizeInMiB", 0),
    )


def describe(names: list[str], ec2_client) -> dict[str, InstanceType]:
    resp = ec2_client.describe_instance_types(InstanceTypes=list(names))
    return {it.name: it for it in map(from_describe, resp["InstanceTypes"])}


def lookup(names: list[str], source: str = "offline", ec2_client=None) -> dict[str, InstanceType]:
    """Facts for ``names``. ``source``: 'offline' (the table) or 'ec2' (DescribeInstanceTypes).

    Unknown names are left out; the caller turns that into a profile error naming the type.
    """
    if source == "ec2":
        if ec2_client is None:
            import boto3
            ec2_client = boto3.client("ec2")
        return describe(names, ec2_client)
    table = offline_table()
    return {n: table[n] for n in names if n in table}
