"""Fixtures of the controller tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory):
    """A fresh API server per module with Karpenter's CRDs (and the Auto Mode test CRD) but not nodewarm's: a
    cluster before its first install, with one kubelet identity (node-0)."""
    from nodewarm_dev.testenv import kube as kubeenv
    from nodewarm_dev.testenv.crds import all_crds

    cluster = kubeenv.start(tmp_path_factory.mktemp("bare"), node_names=("node-0",))
    try:
        cluster.apply_crds([c for c in all_crds() if c["spec"]["group"] != "nodewarm.io"])
        yield cluster
    finally:
        cluster.stop()
