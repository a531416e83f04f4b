"""Per-node timelines of a scale-up: what happened when, in order, as a table, JSON and a PNG chart.

Pure functions over recorded wall-clock times (seconds since the epoch, as the demo observed them);
only ``write_png`` touches matplotlib.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# The phases in the order they must happen on a warm node.
PHASES = ("launched", "registered", "nvme_verified", "weights_done", "compile_cache_restored",
          "warm_reported", "taint_lifted", "pod_bound")
LABELS = {
    "launched": "launched", "registered": "registered", "nvme_verified": "NVMe verified",
    "weights_done": "weights done", "compile_cache_restored": "compile cache", "warm_reported": "Warm=True",
    "taint_lifted": "taint lifted", "pod_bound": "pod bound",
}


@dataclass
class NodeTimeline:
    node: str
    times: dict[str, float] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)     # bytes, throughput, cache hit/miss...

    def mark(self, phase: str, t: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        self.times.setdefault(phase, t)

    def order_violations(self) -> list[str]:
        """Phases recorded out of order (e.g. a pod bound before its node's taint was lifted)."""
        seen = [(p, self.times[p]) for p in PHASES if p in self.times]
        return [f"{a} ({ta:.3f}) after {b} ({tb:.3f})" for (a, ta), (b, tb) in zip(seen, seen[1:]) if tb < ta]


def relative(nodes: list[NodeTimeline]) -> tuple[float, dict[str, dict[str, float]]]:
    t0 = min((t for n in nodes for t in n.times.values()), default=0.0)
    return t0, {n.node: {p: round(n.times[p] - t0, 3) for p in PHASES if p in n.times} for n in nodes}


def summary(nodes: list[NodeTimeline], baseline: dict | None = None) -> dict:
    t0, rel = relative(nodes)
    serve = [r["pod_bound"] - r["launched"] for r in rel.values() if "pod_bound" in r and "launched" in r]
    doc = {
        "t0_epoch": t0,
        "nodes": {n.node: {"seconds": rel[n.node], "facts": n.facts, "order_violations": n.order_violations()}
                  for n in nodes},
        "totals": {"nodes": len(nodes), "all_bound": all("pod_bound" in r for r in rel.values()),
                   "launch_to_bound_s_max": max(serve) if serve else None,
                   "launch_to_bound_s_mean": round(sum(serve) / len(serve), 3) if serve else None},
    }
    if baseline is not None:
        doc["baseline"] = baseline
    return doc


def table(nodes: list[NodeTimeline]) -> str:
    _, rel = relative(nodes)
    cols = [p for p in PHASES if any(p in r for r in rel.values())]
    head = ["node"] + [LABELS[c] for c in cols]
    rows = [[n] + [f"{r[c]:.2f}s" if c in r else "-" for c in cols] for n, r in rel.items()]
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [head] + rows)


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.rename(path)


def write_png(nodes: list[NodeTimeline], path: Path, baseline_s: float | None = None) -> None:
    """A Gantt-like chart: one row per node, one coloured segment per phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, rel = relative(nodes)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(rel)))
    colours = plt.get_cmap("tab10")
    for row, (name, r) in enumerate(rel.items()):
        marks = [(p, r[p]) for p in PHASES if p in r]
        for (p, start), (_, end) in zip(marks, marks[1:]):
            ax.broken_barh([(start, max(end - start, 0.02))], (row - 0.35, 0.7), color=colours(PHASES.index(p)))
    from matplotlib.patches import Patch

    handles = [Patch(color=colours(i), label=f"{LABELS[p]} → next") for i, p in enumerate(PHASES[:-1])]
    if baseline_s is not None:
        handles.append(ax.axvline(baseline_s, color="black", linestyle="--",
                                  label=f"no-warm baseline: first compiled call ({baseline_s:.1f}s)"))
    ax.set_yticks(range(len(rel)), list(rel))
    ax.set_xlabel("seconds since first launch")
    ax.set_title("nodewarm: scale-up timeline per node")
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
