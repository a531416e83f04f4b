"""Per-node timelines of a scale-up: what happened when, in order, as a table, JSON and a PNG chart.

Pure functions over recorded wall-clock times (seconds since the epoch, as the demo observed them);
only ``write_png`` touches matplotlib.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from nodewarm.api.timeline import Timeline


class DemoPhase(StrEnum):
    """The moments the demo records itself, around the node agent's own (``Timeline``, the agent's wire format)."""
    LAUNCHED = "launched"
    REGISTERED = "registered"
    TAINT_LIFTED = "taint_lifted"
    POD_BOUND = "pod_bound"
    ENGINE_READY = "engine_ready"            # real vLLM: /health answers
    FIRST_COMPLETION = "first_completion"    # real vLLM: the first /v1/completions answered
    SERVING = "serving"                      # the probe engine: its first compiled call returned


# Every moment the demo records; the node agent's phases run at once, so only some are ordered.
PHASES = (DemoPhase.LAUNCHED, DemoPhase.REGISTERED, Timeline.WEIGHTS_STARTED, Timeline.COMPILE_CACHE_STARTED,
          Timeline.IMAGE_PREPULL_STARTED, Timeline.FIRST_BYTE, Timeline.IMAGE_PREPULL_DONE,
          Timeline.COMPILE_CACHE_RESTORED, Timeline.WEIGHTS_DONE, Timeline.WARM_REPORTED, DemoPhase.TAINT_LIFTED,
          DemoPhase.POD_BOUND, DemoPhase.ENGINE_READY, DemoPhase.FIRST_COMPLETION, DemoPhase.SERVING)
# What must happen in this order on a warm node; each agent phase must also end before Warm is reported.
# With real vLLM a node serves at first_completion (its engine_ready before); with the probe at serving.
ORDER = (DemoPhase.LAUNCHED, DemoPhase.REGISTERED, Timeline.WARM_REPORTED, DemoPhase.TAINT_LIFTED, DemoPhase.POD_BOUND,
         DemoPhase.ENGINE_READY, DemoPhase.FIRST_COMPLETION, DemoPhase.SERVING)
SERVED = (DemoPhase.FIRST_COMPLETION, DemoPhase.SERVING)
BEFORE_WARM = (Timeline.WEIGHTS_DONE, Timeline.COMPILE_CACHE_RESTORED, Timeline.IMAGE_PREPULL_DONE)
LABELS = {
    DemoPhase.LAUNCHED: "launched", DemoPhase.REGISTERED: "registered", Timeline.WEIGHTS_STARTED: "pull started",
    Timeline.COMPILE_CACHE_STARTED: "restore started", Timeline.IMAGE_PREPULL_STARTED: "image wait started",
    Timeline.FIRST_BYTE: "first byte", Timeline.IMAGE_PREPULL_DONE: "image pulled",
    Timeline.COMPILE_CACHE_RESTORED: "cache restored", Timeline.WEIGHTS_DONE: "weights done",
    Timeline.WARM_REPORTED: "Warm=True", DemoPhase.TAINT_LIFTED: "taint lifted", DemoPhase.POD_BOUND: "pod bound",
    DemoPhase.ENGINE_READY: "vLLM ready", DemoPhase.FIRST_COMPLETION: "first completion",
    DemoPhase.SERVING: "first compiled call",
}
# The bars of the chart, named in words: (label, from, to). The agent's three overlap by design.
SPANS = (
    ("boot to agent start", DemoPhase.REGISTERED, Timeline.WEIGHTS_STARTED),
    ("pull weights", Timeline.WEIGHTS_STARTED, Timeline.WEIGHTS_DONE),
    ("restore compile cache", Timeline.COMPILE_CACHE_STARTED, Timeline.COMPILE_CACHE_RESTORED),
    ("wait for serving image", Timeline.IMAGE_PREPULL_STARTED, Timeline.IMAGE_PREPULL_DONE),
    ("report Warm, lift taint", Timeline.WEIGHTS_DONE, DemoPhase.TAINT_LIFTED),
    ("wait for scheduler", DemoPhase.TAINT_LIFTED, DemoPhase.POD_BOUND),
    # Real vLLM: the pod's start to /health answering (load from NVMe, compile or load the compiled artifacts,
    # KV cache, warm-up), then the first /v1/completions answered.
    ("engine boot (vLLM)", DemoPhase.POD_BOUND, DemoPhase.ENGINE_READY),
    ("first completion", DemoPhase.ENGINE_READY, DemoPhase.FIRST_COMPLETION),
    # The probe engine's pod loads nothing (a pause container): this is the first torch.compile call alone, against
    # the restored cache. The baseline's pod pays its own weight pull as a bar of its own.
    ("first compiled call", DemoPhase.POD_BOUND, DemoPhase.SERVING),
)
# The no-warm baseline's bars, in order from its nodes' registration: its own row, its own colours. Each is drawn
# when the baseline has it (the vLLM engine's or the probe's).
BASELINE_SPANS = (
    ("no-warm baseline: wait for scheduler", "scheduler_wait_s"),
    ("no-warm baseline: vLLM boot, streaming from S3, cold compile", "engine_boot_s"),
    ("no-warm baseline: first completion", "first_completion_s"),
    ("no-warm baseline: pull weights from S3 in the pod", "pull_from_s3_s"),
    ("no-warm baseline: cold compile, first call", "cold_compile_first_call_s"),
)


def legend_labels() -> list[str]:
    """What the chart's legend names, in its order: nodewarm's phases, then the baseline's."""
    return [label for label, _, _ in SPANS] + [label for label, _ in BASELINE_SPANS]


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
        """Moments recorded out of order (e.g. a pod bound before its node's taint was lifted)."""
        seen = [(p, self.times[p]) for p in ORDER if p in self.times]
        out = [f"{a} ({ta:.3f}) after {b} ({tb:.3f})" for (a, ta), (b, tb) in zip(seen, seen[1:]) if tb < ta]
        warm = self.times.get(Timeline.WARM_REPORTED)
        if warm is not None:
            out += [f"{Timeline.WARM_REPORTED} ({warm:.3f}) before {p} ({self.times[p]:.3f})"
                    for p in BEFORE_WARM if p in self.times and self.times[p] > warm]
        return out


def relative(nodes: list[NodeTimeline]) -> tuple[float, dict[str, dict[str, float]]]:
    t0 = min((t for n in nodes for t in n.times.values()), default=0.0)
    return t0, {n.node: {p: round(n.times[p] - t0, 3) for p in PHASES if p in n.times} for n in nodes}


def summary(nodes: list[NodeTimeline], baseline: dict | None = None) -> dict:
    t0, rel = relative(nodes)
    serve = [r[DemoPhase.POD_BOUND] - r[DemoPhase.LAUNCHED] for r in rel.values()
             if DemoPhase.POD_BOUND in r and DemoPhase.LAUNCHED in r]
    doc = {
        "t0_epoch": t0,
        "nodes": {n.node: {"seconds": rel[n.node], "facts": n.facts, "order_violations": n.order_violations()}
                  for n in nodes},
        "totals": {"nodes": len(nodes), "all_bound": all(DemoPhase.POD_BOUND in r for r in rel.values()),
                   "launch_to_bound_s_max": max(serve) if serve else None,
                   "launch_to_bound_s_mean": round(sum(serve) / len(serve), 3) if serve else None},
    }
    if baseline is not None:
        doc["baseline"] = baseline
    return doc


def table(nodes: list[NodeTimeline]) -> str:
    """One row per node: how long each bar of the chart took (the agent's three overlap)."""
    _, rel = relative(nodes)
    cols = [(label, a, b) for label, a, b in SPANS if any(a in r and b in r for r in rel.values())]
    end = next((p for p in SERVED if any(p in r for r in rel.values())), DemoPhase.SERVING)
    head = ["node"] + [label for label, _, _ in cols] + [f"registered -> {LABELS[end]}"]
    rows = [[n] + [f"{r[b] - r[a]:.1f}s" if a in r and b in r else "-" for _, a, b in cols]
            + [f"{r[end] - r[DemoPhase.REGISTERED]:.1f}s" if end in r and DemoPhase.REGISTERED in r else "-"]
            for n, r in rel.items()]
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in [head] + rows)


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.rename(path)


def write_png(nodes: list[NodeTimeline], path: Path, baseline: dict | None = None) -> None:
    """A Gantt chart: per node one lane per phase (the agent's phases overlap), then the no-warm baseline
    as its own bar: wait for the scheduler, pull from S3, then compile cold, from the same registration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    _, rel = relative(nodes)
    colours = plt.get_cmap("tab20" if len(legend_labels()) > 10 else "tab10")   # one colour per bar
    rows: list[tuple[str, list[tuple[int, float, float]]]] = []
    for name, r in rel.items():
        bars = [(i, r[a], r[b]) for i, (_, a, b) in enumerate(SPANS) if a in r and b in r]
        rows.append((name, bars))
    if baseline is not None and rel:
        start = min(r[DemoPhase.REGISTERED] for r in rel.values() if DemoPhase.REGISTERED in r)
        bars = []
        for i, (_, key) in enumerate(BASELINE_SPANS):
            if key not in baseline:
                continue
            length = float(baseline[key] or 0.0)
            bars.append((len(SPANS) + i, start, start + length))
            start += length
        rows.append(("no-warm baseline", bars))
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.9 * len(rows)))
    for row, (_, bars) in enumerate(rows):
        lanes = sorted({i for i, _, _ in bars})
        for i, start, end in bars:
            # Overlapping phases get their own thin lane inside the node's row; the baseline's are hatched.
            k, h = lanes.index(i), 0.8 / max(len(lanes), 1)
            ax.broken_barh([(start, max(end - start, 0.05))], (row - 0.4 + k * h, h * 0.9), color=colours(i),
                           hatch="//" if i >= len(SPANS) else None, edgecolor="white" if i >= len(SPANS) else None)
    handles = [Patch(facecolor=colours(i), edgecolor="white", hatch="//" if i >= len(SPANS) else None, label=label)
               for i, label in enumerate(legend_labels())
               if any(j == i for _, bars in rows for j, _, _ in bars)]
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first launch")
    ax.set_title("nodewarm: scale-up timeline per node, against the no-warm baseline")
    # Beside the chart, not under it: under it, the legend's rows grow over the axis label as phases are added.
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
