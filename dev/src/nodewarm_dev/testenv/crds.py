"""Every CRD the local API server needs: Karpenter's (nodewarm's own, or a release's when NODEWARM_CRDS_DIR names
them), ours (WarmProfile), and the Auto Mode test CRD."""

from __future__ import annotations

from pathlib import Path

from nodewarm.api.schema import crd as warmprofile_crd

from .kube import karpenter_crds, load_crd_files

AUTOMODE_TEST_CRD = Path(__file__).with_name("eks.amazonaws.com_nodeclasses.test-crd.yaml")


def all_crds() -> list[dict]:
    return karpenter_crds() + load_crd_files([AUTOMODE_TEST_CRD]) + [warmprofile_crd()]
