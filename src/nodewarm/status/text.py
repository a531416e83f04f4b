"""The rows as a table and one node's explanation, as text."""

from __future__ import annotations

from datetime import datetime, timezone

from nodewarm.api.timeutil import fmt_duration

from .explain import Explanation
from .observed import Observed, held_note, owners
from .rows import ModelRow, Row, fmt_gb, fmt_secs

COLUMNS = (("NAME", lambda r: r.name), ("PROFILE", lambda r: r.profile), ("PHASE", lambda r: r.phase),
           ("FOR", lambda r: fmt_duration(r.in_phase_s)), ("WEIGHTS", lambda r: r.weights.text()),
           ("CACHE", lambda r: r.cache), ("REASON", lambda r: r.reason or "-"),
           ("DEADLINE", lambda r: r.deadline_text()))
WIDE = (("ENGINE", lambda r: r.engine), ("MODELS", lambda r: ",".join(m.text() for m in r.models) or "-"),
        ("NODECLAIM", lambda r: r.node_claim or "-"),
        ("INSTANCE-TYPE", lambda r: r.instance_type or "-"),
        ("GENERATION", lambda r: r.generation or "-"), ("IMAGE", lambda r: r.image or "-"),
        ("GPUS", lambda r: r.gpus or "-"))


def table(cells: list[list[str]]) -> str:
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def format_rows(rs: list[Row], wide: bool = False) -> str:
    cols = COLUMNS + (WIDE if wide else ())
    return table([[h for h, _ in cols]] + [[f(r) for _, f in cols] for r in rs])


def _clock(t: float | None, ref: float | None) -> str:
    if t is None:
        return "-"
    s = datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    return s + (f" (+{t - ref:.1f}s)" if ref is not None and t >= ref else "")


def model_cells(ms: tuple[ModelRow, ...]) -> list[list[str]]:
    """GENERATION: held verified, and whether the Node carries its label (no: its pods cannot land here yet)."""
    cells = [["MODEL", "STATE", "GENERATION", "LABEL", "SIZE", "LAST USED", "PENDING", "MESSAGE"]]
    for m in ms:
        why = f"{m.reason}: {m.message}" if m.reason else m.message
        cells.append([m.name, m.state, m.generation or "-", "yes" if m.labelled else "no",
                      f"{fmt_gb(m.bytes)} GB" if m.bytes else "-", m.last_used or "-", m.pending or "-",
                      why[:160] or "-"])
    return cells


def format_explanation(x: Explanation) -> str:
    r = x.row
    lines = [f"Node:        {r.node or '<none yet>'}", f"NodeClaim:   {r.node_claim or '-'}",
             f"Profile:     {r.profile or '-'}" + (f" (deadline {r.deadline}, onDeadline={r.on_deadline})"
                                                   if r.deadline else "")
             + (f" deleted, clean-up held: {r.cleanup}" if r.cleanup else ""),
             f"Phase:       {r.phase} for {fmt_duration(r.in_phase_s)}",
             f"Reason:      {r.reason or '-'}" + (f": {r.message}" if r.message else ""),
             f"Weights:     {r.weights.text()}", f"Cache:       {r.cache}",
             *([f"Engine:      {x.engine}"] if x.engine else []),
             f"Deadline:    {r.deadline_text()}" + (" left" if (r.deadline_left_s or 0) > 0 else "")]
    if r.instance_type or r.generation or r.gpus:
        lines.append(f"Instance:    {r.instance_type or '-'}  generation {r.generation or '-'}  GPUs {r.gpus or '-'}")
    if r.models:
        lines.append("")
        lines.append("Models:")
        lines += ["  " + line for line in table(model_cells(r.models)).splitlines()]
    lines.append("")
    lines.append("Waiting for:")
    lines += [f"  - {w}" for w in x.waits_for] or ["  - nothing"]
    lines.append("")
    lines.append("Timeline (UTC; + from the first step):")
    ref = next((s.start for s in x.steps if s.start is not None), None)
    if x.steps:
        cells = [["STEP", "START", "END", "TOOK", "OUTCOME"]]
        for s in x.steps:
            took = fmt_secs(s.end - s.start) if s.start is not None and s.end is not None else "-"
            cells.append([s.what, _clock(s.start, ref), _clock(s.end, ref), took, s.outcome or "-"])
        lines += ["  " + line for line in table(cells).splitlines()]
    else:
        lines.append("  (nothing recorded yet)")
    if x.notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {n}" for n in x.notes]
    lines.append("")
    lines.append("Events (last, oldest first):")
    if x.events:
        cells = [["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]]
        cells += [[_clock(e.time, None), e.type, e.reason, e.object, e.message[:160]] for e in x.events]
        lines += ["  " + line for line in table(cells).splitlines()]
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def held_notes(rs: list[Row], obs: Observed) -> list[str]:
    """One line per held profile among the rows: what its clean-up waits for and how to finish it."""
    shown = {r.profile for r in rs if r.cleanup}
    return [held_note(p) for p in owners(obs).values() if p.name in shown]
