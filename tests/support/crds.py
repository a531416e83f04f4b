"""The CRD schemas tests check rendered objects against: Karpenter's CRDs in force (nodewarm's own, or a release's
when NODEWARM_CRDS_DIR names them; docs/testing.md, "Karpenter's CRDs in the tests") and the Auto Mode test CRD."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodewarm.nodeclasses import crdvalidate
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv.crds import AUTOMODE_TEST_CRD

# Where CI's copy of the upstream CRDs keeps the latest release beside the newest main.
RELEASE_SUBDIR = "release-v1.14.1"


def strict_crds() -> dict:
    return crdvalidate.load_docs(kubeenv.karpenter_crds() + kubeenv.load_crd_files([AUTOMODE_TEST_CRD]))


def upstream_dir() -> Path:
    """The upstream CRD folder, or a skip that says how to run the test: it checks against upstream itself."""
    d = kubeenv.crds_dir()
    if d is None:
        pytest.skip(f"compares with a Karpenter release's own CRDs: set {kubeenv.CRDS_ENV} to its pkg/apis/crds")
    return d


def upstream_release_dir() -> Path:
    """The latest release's CRDs where the upstream folder keeps them beside main's (CI's copy does)."""
    d = upstream_dir() / RELEASE_SUBDIR
    if not d.is_dir():
        pytest.skip(f"needs {RELEASE_SUBDIR}/ in {kubeenv.CRDS_ENV} (the release beside main's CRDs)")
    return d


def upstream_crds(directory: Path | None = None) -> dict:
    return crdvalidate.load_dir(kubeenv.upstream_crd_files(directory or upstream_dir()))
