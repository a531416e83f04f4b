"""Services for a real node's pods (realnode ``services``): what kube-proxy gives a cluster's pods, reduced to the
addresses a test names.

A pod on a real node's bridge (``10.250.N.0/24``) has its own network namespace: the API server and the S3 server on
the host's 127.0.0.1 are out of its reach, and a ClusterIP (the ``kubernetes`` Service's, which the kubelet puts in
every pod's KUBERNETES_SERVICE_HOST) routes nowhere, since no kube-proxy runs here. So, for each service
``VIP:PORT -> HOST:PORT`` the node is given:

- a **relay** in this process listens on the bridge's gateway address (a port of its own) and copies bytes to and from
  the host address: kube-proxy's old userspace mode;
- a **CNI plugin**, chained after the bridge plugin, adds ``iptables -t nat -A OUTPUT -d VIP --dport PORT -j DNAT
  --to-destination GATEWAY:RELAYPORT`` in each new pod's network namespace. The rules live and die with the pod's
  namespace: nothing is written to the host's tables.

The pod connects to the VIP exactly as in a cluster (TLS to the API server checks the ClusterIP, which the server's
certificate names; S3 signs the VIP as its Host), and the bytes arrive unchanged.
"""

from __future__ import annotations

import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN = "nodewarm-services"


def parse(services: dict[str, str]) -> list[tuple[str, int, str, int]]:
    """{"VIP:PORT": "HOST:PORT"} as (vip, port, host, host_port); a malformed entry raises ValueError naming it."""
    out = []
    for vip, target in services.items():
        try:
            a, p = vip.rsplit(":", 1)
            h, hp = target.rsplit(":", 1)
            out.append((a, int(p), h, int(hp)))
        except ValueError:
            raise ValueError(f"service {vip!r} -> {target!r}: use 'ADDRESS:PORT' on both sides") from None
    return out


@dataclass
class Relay:
    """A TCP relay from ``listen`` (gateway, port) to ``target`` (host, port), in daemon threads until ``close``."""

    listen: tuple[str, int]
    target: tuple[str, int]
    _sock: socket.socket | None = field(default=None, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self) -> "Relay":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(self.listen)
        s.listen(64)
        self.listen, self._sock = s.getsockname(), s
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{self.listen[1]}").start()
        return self

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            self._sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()


def start_relays(gateway: str, services: dict[str, str]) -> tuple[list[Relay], list[list]]:
    """One relay per service on ``gateway``; returns them and the DNAT rules (vip, port, gateway, relay port)."""
    relays, rules = [], []
    try:
        for vip, port, host, host_port in parse(services):
            r = Relay((gateway, 0), (host, host_port)).start()
            relays.append(r)
            rules.append([vip, port, gateway, r.listen[1]])
    except BaseException:
        for r in relays:
            r.close()
        raise
    return relays, rules


# The plugin: CNI 0.4.0, chained (its input carries the bridge plugin's prevResult, which it passes on).
_PLUGIN_SOURCE = '''#!{python}
import json, os, subprocess, sys
conf = json.load(sys.stdin)
cmd = os.environ.get("CNI_COMMAND")
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0"]}}))
    sys.exit(0)
if cmd == "ADD":
    for vip, port, gw, relay in conf.get("rules", []):
        subprocess.run(["nsenter", "--net=" + os.environ["CNI_NETNS"], "iptables", "-w", "-t", "nat", "-A", "OUTPUT",
                        "-d", vip, "-p", "tcp", "--dport", str(port), "-j", "DNAT",
                        "--to-destination", "%s:%d" % (gw, relay)], check=True, capture_output=True)
    print(json.dumps(conf.get("prevResult") or {{"cniVersion": conf.get("cniVersion", "0.4.0")}}))
'''


def write_plugin(bin_dir: Path) -> None:
    """The plugin as ``bin_dir/nodewarm-services`` (run by containerd with this interpreter)."""
    path = bin_dir / PLUGIN
    path.write_text(_PLUGIN_SOURCE.format(python=sys.executable))
    path.chmod(0o755)


def plugin_conf(rules: list[list]) -> dict:
    return {"type": PLUGIN, "rules": rules}
