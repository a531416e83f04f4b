"""Every CRD the local API server needs: upstream Karpenter's, ours (WarmProfile), and the Auto Mode test CRD."""

from __future__ import annotations

from pathlib import Path

from nodewarm.api.schema import crd as warmprofile_crd

from .kube import load_crd_files, upstream_crd_files

AUTOMODE_TEST_CRD = Path(__file__).with_name("eks.amazonaws.com_nodeclasses.test-crd.yaml")


def all_crds(upstream_dir: Path | None = None) -> list[dict]:
    return load_crd_files(upstream_crd_files(upstream_dir) + [AUTOMODE_TEST_CRD]) + [warmprofile_crd()]
