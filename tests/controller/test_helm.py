"""The Helm chart (deploy/helm/nodewarm), like Karpenter's: one source (it is generated from
nodewarm/controller/manifests.py and schema.crd(), and cannot drift from them), rendered by the real helm, installed by
`helm install` on the local API server, and the controller it deploys, run with exactly its container's
command and args as its ServiceAccount, lifts the startup taint of a node that reports Warm."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller import cli as controller_cli
from nodewarm.controller import install, manifests
from nodewarm.controller.kube import LEASES, NODEPOOLS, WARMPROFILES, Resource
from nodewarm import __version__
from nodewarm.api.schema import crd
from nodewarm_dev.testenv.ports import free_port
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import TAINT, events_for, installed, taint_keys, wait_for
from support import paths

REPO = paths.REPO
CHART = REPO / "deploy" / "helm" / "nodewarm"
IMAGE = "registry.example/nodewarm"
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)


def _helm() -> str:
    helm = shutil.which("helm")
    assert helm, "helm is needed on PATH: `bash scripts/setup.sh` installs it (the chart's tests run the real helm)"
    return helm


def _key(d: dict) -> tuple:
    return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]


def _template(*args: str, namespace: str = "nodewarm") -> list[dict]:
    out = subprocess.run([_helm(), "template", "nodewarm", str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, timeout=60, check=True)
    return sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=_key)


def _container(docs: list[dict]) -> dict:
    dep = next(d for d in docs if d["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_the_checked_in_chart_is_the_generated_one():
    stale = install.differences(CHART)
    assert not stale, f"{stale} differ from the generator: run `python -m nodewarm.controller.install {CHART}`"
    on_disk = {str(p.relative_to(CHART)) for p in CHART.rglob("*") if p.is_file()}
    assert on_disk == set(install.files()), "a file in the chart that the generator does not write"
    assert install.main([str(CHART), "--check"]) == 0


def test_default_values_render_exactly_the_controller_manifests():
    """helm's output with the defaults is manifests.render()'s objects (less the Namespace: the release's, made
    by --create-namespace) and the CRD, value for value: the templates are those objects."""
    docs = _template("--include-crds", "--set", f"image.repository={IMAGE}")
    want = [crd(), *manifests.render(f"{IMAGE}:{__version__}", "nodewarm")[1:]]
    assert docs == sorted(want, key=_key)
    # Another release namespace moves everything namespaced there, but the events Role stays in `default`.
    ops = _template("--set", f"image.repository={IMAGE}", namespace="ops")
    assert ops == sorted(manifests.render(f"{IMAGE}:{__version__}", "ops")[1:], key=_key)
    assert subprocess.run([_helm(), "lint", str(CHART), "--set", f"image.repository={IMAGE}"],
                          capture_output=True, timeout=60).returncode == 0


def test_values_set_image_replicas_resources_leader_election_metrics_and_servicemonitor(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "image": {"repository": IMAGE, "tag": "1.2.3"}, "replicas": 1, "leaderElection": {"enabled": False},
        "metrics": {"port": 9090}, "health": {"port": 9091},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "extraArgs": ["--replace-budget=5", "--workers=8"],
        "serviceMonitor": {"enabled": True, "interval": "15s"},
    }))
    docs = _template("-f", str(values))
    by_kind = {d["kind"]: d for d in docs}
    c = _container(docs)
    assert c["image"] == f"{IMAGE}:1.2.3" and by_kind["Deployment"]["spec"]["replicas"] == 1
    assert c["args"] == ["controller", "--metrics-port=9090", "--health-port=9091", "--replace-budget=5", "--workers=8"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9090, "health": 9091}
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    # The flags are the real CLI's: they parse, and mean what the values say.
    opts = controller_cli.options_from(_parse(c["args"]))
    assert (opts.metrics_port, opts.health_port, opts.leader_elect, opts.replace_budget, opts.workers) == \
        (9090, 9091, False, 5, 8)
    svc, sm = by_kind["Service"], by_kind["ServiceMonitor"]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= by_kind["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    # Defaults: leader election on (on the release namespace's Lease), no ServiceMonitor (its CRD may be absent).
    default = _template("--set", f"image.repository={IMAGE}")
    assert "ServiceMonitor" not in {d["kind"] for d in default}
    assert _container(default)["args"][1:3] == ["--leader-elect", "--lease-namespace=nodewarm"]
    # The image has no default anyone could pull: helm says what to set.
    bare = subprocess.run([_helm(), "template", "nodewarm", str(CHART)], capture_output=True, text=True, timeout=60)
    assert bare.returncode != 0 and "set image.repository" in bare.stderr


def _parse(args: list[str]):
    import argparse

    p = argparse.ArgumentParser()
    controller_cli.register(p.add_subparsers())
    return p.parse_args(args)


SERVICEMONITOR_CRD = {   # the Prometheus Operator's CRD, reduced to what an API server needs to store the object
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor",
                       "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def _documented_install() -> list[str]:
    """`helm install ...` exactly as `python -m nodewarm.controller.install --help` prints it."""
    line = next(x for x in install.__doc__.splitlines() if x.strip().startswith("helm install "))
    return line.split()


@pytest.mark.kube
def test_helm_install_then_its_controller_lifts_a_warm_nodes_taint(bare_cluster, tmp_path):
    from nodewarm.controller.kube import Kube

    kube = bare_cluster
    kube.apply_crds([SERVICEMONITOR_CRD])       # the chart's ServiceMonitor needs the Prometheus Operator's CRD
    admin = kube.api_client()
    k = Kube(admin)
    env = {**os.environ, "KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kubeconfig"))}
    cmd = _documented_install()
    assert cmd[:3] == ["helm", "install", "nodewarm"] and "deploy/helm/nodewarm" in cmd
    metrics_port, health_port = free_port(), free_port()     # this machine's 8080 may be taken
    cmd = [_helm(), *cmd[1:]]
    cmd[cmd.index("deploy/helm/nodewarm")] = str(CHART)
    cmd[cmd.index("image.repository=REPO")] = f"image.repository={IMAGE}"
    cmd += ["--set", "serviceMonitor.enabled=true", "--set", f"metrics.port={metrics_port}",
            "--set", f"health.port={health_port}", "--set", "extraArgs={--replace-budget=5}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    proc = None
    try:
        dep = k.get(DEPLOYMENTS, manifests.NAME, "nodewarm")          # what the cluster now holds
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["image"] == f"{IMAGE}:{__version__}" and c["command"] == ["nodewarm"] and "--leader-elect" in c["args"]
        assert k.get(Resource("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", namespaced=True),
                     manifests.NAME, "nodewarm")["spec"]["endpoints"][0]["port"] == "metrics"
        # The pod as its kubelet would start it: the image's `nodewarm` (the console script of this environment),
        # exactly the container's args, the ServiceAccount's token (--kubeconfig stands in for its mount).
        token = kube.service_account_token("nodewarm", pod["serviceAccountName"])
        sa_kubeconfig = kube.write_kubeconfig(tmp_path / "sa-kubeconfig", token=token, user="controller")
        exe = os.path.join(os.path.dirname(sys.executable), c["command"][0])
        log = open(tmp_path / "controller.log", "w")
        run_env = {n: v for n, v in os.environ.items() if n not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        # A WarmProfile right after `helm install` returned: its CRD is served by then.
        with installed(k, user_data=None, user_startup_taints=()) as inst:
            proc = subprocess.Popen([exe, *c["args"], "--kubeconfig", str(sa_kubeconfig)], stdout=log,
                                    stderr=subprocess.STDOUT, env=run_env, cwd=tmp_path)
            wait_for(lambda: TAINT in [t["key"] for t in k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]
                                       .get("startupTaints") or ()], timeout_s=60, what="startup taint injected")
            assert k.get(LEASES, "nodewarm-controller", "nodewarm")["spec"]["holderIdentity"]
            wait_for(lambda: (k.get(WARMPROFILES, inst.name).get("status") or {}).get("conditions"),
                     what="WarmProfile status written")
            n = KarpenterSim(admin).scale_up(inst.pool, node_name="node-0")
            assert TAINT in taint_keys(k, n.node)
            report_warm(kube.api_client(kube.node_token("node-0")), "node-0", True, "WeightsVerified", "verified",
                        {"nodewarm.io/compile-cache": "hit"})
            wait_for(lambda: TAINT not in taint_keys(k, n.node), timeout_s=30,
                     what="taint lifted by the installed controller")
            wait_for(lambda: events_for(k, "Node", n.node), what="event written as the ServiceAccount")
            # The probes and the Service's target, by the port names the Deployment gives them.
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                get = c[probe]["httpGet"]
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[get['port']]}{get['path']}", timeout=5) as r:
                    assert r.status == 200
            svc = k.get(Resource("", "v1", "services", "Service", namespaced=True), f"{manifests.NAME}-metrics",
                        "nodewarm")
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[svc['spec']['ports'][0]['targetPort']]}/metrics",
                                        timeout=5) as r:
                body = r.read().decode()
            assert f'nodewarm_taints_removed_total{{nodepool="{inst.pool}"}} 1.0' in body, body[:2000]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, (tmp_path / "controller.log").read_text()[-3000:]
            proc = None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
            print((tmp_path / "controller.log").read_text()[-3000:])
