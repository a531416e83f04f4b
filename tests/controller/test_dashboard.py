"""The Grafana dashboard and the example PromQL of docs/operations.md against the metrics the controller really
exposes.

The exposition is not written down here: a real ``controller.metrics.Metrics`` is driven the way the controller
drives it (the planner's own plans for a warm node and each deadline action go through ``Metrics.observe``; the
served compile-cache outcome goes through the NodeClaim feature's own ``count_served_cache_outcome``), scraped over
its HTTP endpoint and parsed with prometheus_client's parser. Every query is parsed by a small PromQL parser
(selectors, matchers, aggregations with by/without, functions, binary operators with on/ignoring) that works
out the labels each sub-expression carries, so ``sum by (nodepool)`` over a metric without that label, a
misspelt metric or label value, or a ratio whose two sides cannot match fails here, not on an empty panel.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import urllib.request
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodewarm import profile
from nodewarm.api.decisions import Decision
from nodewarm.api.names import CACHE_ANNOTATION, STATE_ANNOTATION, WARM_CONDITION
from nodewarm.api.timeutil import fmt_time
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm.controller.nodeclaim.controller import count_served_cache_outcome
from nodewarm.controller.metrics import HttpEndpoints, Metrics, metrics_routes
from nodewarm.controller.warmprofile import peerkeys
from nodewarm.api.views import ClaimView, NodeView, WarmState
from support import builders
from support.builders import v
from support import paths

REPO = paths.REPO
DASHBOARD = REPO / "deploy" / "grafana" / "nodewarm-dashboard.json"
EXAMPLES = REPO / "deploy" / "grafana" / "promql-examples.json"
T0 = 1_800_000_000.0
POOL = "gpu-p5"
# Grafana's built-in variables; anything else a query uses must be one of the dashboard's own.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__range_ms", "__interval_ms"}


# -- the controller's real exposition --------------------------------------------------------------------------

def _claim(pool: str) -> ClaimView:
    return ClaimView.from_obj(builders.nodeclaim("c1", pool=pool, created=T0 - 70, launched=T0 - 60, registered=T0))


def _node(pool: str, warm: str | None, annotations: dict | None = None) -> NodeView:
    """n1 of ``pool``: warm (the agent verified the weights), not warm (not on instance store) or not reported."""
    cond = None if warm is None else builders.condition(
        WARM_CONDITION, warm, "WeightsVerified" if warm == "True" else "NotInstanceStore", T0 + 30, "m")
    return NodeView.from_obj(builders.node("n1", pool=pool, created=T0, warm=cond, annotations=annotations))


def exercised_metrics() -> Metrics:
    """A Metrics holding one of every series the controller produces, produced by the controller's own code
    where that code is pure (the planner's counters and durations, the served compile-cache count)."""
    m = Metrics()
    claim = _claim(POOL)
    plans = [planner.plan_claim(claim, _node(POOL, "True", {CACHE_ANNOTATION: "cold"}),
                                profile.from_dict(v(metadata__name="p1")), T0 + 31)]
    for action, warm in (("replace", None), ("untaint", None), ("keep", None), ("replace", "False")):
        p = profile.from_dict(v(metadata__name="p1", spec__readiness__onDeadline=action, spec__readiness__deadline="5m"))
        plans.append(planner.plan_claim(claim, _node(POOL, warm), p, T0 + 301))
    # A taint put back after the lift: lifted again and counted as re-added (nodeclaim/untaint.py).
    back = WarmState("p1", "c1", Decision.UNTAINTED, registered=fmt_time(T0), decided=fmt_time(T0 + 31)).to_json()
    plans.append(planner.plan_claim(claim, _node(POOL, "True", {STATE_ANNOTATION: back}),
                                    profile.from_dict(v(metadata__name="p1")), T0 + 60))
    assert ("taints_readded", "") in plans[-1].counters
    assert {pl.deadline for pl in plans} == {"", "replace", "untaint", "keep", "not_replaced"}
    for pl in plans:
        m.observe(claim.nodepool, pl.counters, pl.durations)
    # hit|miss are counted when serving proves them, by the NodeClaim feature's own watch of Nodes.
    leader = threading.Event()
    leader.set()
    fake = SimpleNamespace(metrics=m, is_leader=leader, log=SimpleNamespace(info=lambda *a, **kw: None))
    for result in ("hit", "miss"):
        count_served_cache_outcome(fake, "MODIFIED", _node(POOL, "True", {CACHE_ANNOTATION: "restored"}),
                                   _node(POOL, "True", {CACHE_ANNOTATION: result}))
    # The engine check's, from its pure plan (passed with its times, failed with its reason), counted by its shell.
    from nodewarm.api import enginecheck as contract
    from nodewarm.controller.enginecheck import plan as ec
    from nodewarm.controller.enginecheck.controller import EngineCheckController

    p = profile.from_dict(v(metadata__name="p1", spec__readiness__engineCheck={"enabled": True, "image": "x"}))
    pod = ec.CheckPod("p", "ns", "u", "n1", "r1", False)
    shell = EngineCheckController(SimpleNamespace(metrics=m))
    for out in (contract.Outcome("r1", "passed", "EngineServed", "ok", boot_s=40.0, first_token_s=0.5),
                contract.Outcome("r1", "failed", "CompileCacheNotLoaded", "compiled again")):
        node = _node(POOL, None, {contract.REQUEST_ANNOTATION: out.to_json()})
        shell._observe(p, ec.plan("n1", node, p, "nodewarm.io/warming", [pod]))
    # The rest as the controller (nodewarm.controller) labels them.
    for kind, result in (("EC2NodeClass", "applied"), ("NodePool", "uptodate"), ("NodePool", "audit"),
                         ("WarmProfile", "Differs")):
        m.injections.labels(kind, result).inc()
    m.writes.labels("nodes", "PATCH").inc()
    m.writes.labels("nodeclaims", "DELETE").inc()
    m.conflicts.labels("nodes").inc()
    m.conflicts.labels("nodeclaims").inc()
    for kind in ("claim", "profile", "budget"):
        m.reconcile_errors.labels(kind).inc()
    m.queue_depth.set(3)
    m.device_plugins_missing.labels("p1").set(1)
    for action in (*peerkeys.REASONS, "forbidden"):     # warmprofile/peerkeys.py's decisions
        m.peer_keys.labels("p1", action).inc()
    from nodewarm.controller.modellabels import plan as modellabels

    for action in (modellabels.LABEL, modellabels.SWITCH, modellabels.UNLABEL, modellabels.NO_CAPACITY):
        m.model_labels.labels("p1", action).inc()
    m.leader.set(1)
    return m


@dataclass
class Exposed:
    labels: dict[str, set[str]]                  # sample name -> label names
    values: dict[str, dict[str, set[str]]]       # sample name -> label -> values seen
    families: dict[str, str]                     # family name -> type


def parse_exposition(text: str) -> Exposed:
    labels: dict[str, set[str]] = {}
    values: dict[str, dict[str, set[str]]] = {}
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam.type
        for s in fam.samples:
            labels.setdefault(s.name, set()).update(s.labels)
            for k, val in s.labels.items():
                values.setdefault(s.name, {}).setdefault(k, set()).add(val)
    return Exposed(labels, values, families)


@pytest.fixture(scope="module")
def exposed() -> Exposed:
    """Scraped over the controller's own /metrics endpoint, as Prometheus would."""
    m = exercised_metrics()
    http = HttpEndpoints(0, metrics_routes(m), host="127.0.0.1").start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http.port}/metrics", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    finally:
        http.stop()
    return parse_exposition(text)


# -- a small PromQL parser that tracks labels ------------------------------------------------------------------

AGGREGATORS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
               "count_values", "limitk", "limit_ratio"}
# Functions whose result keeps the labels of their (first) vector argument.
KEEP_LABELS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes", "abs", "ceil", "floor",
               "round", "exp", "ln", "log2", "log10", "sqrt", "clamp", "clamp_min", "clamp_max", "sort", "sort_desc",
               "timestamp", "predict_linear", "holt_winters", "avg_over_time", "min_over_time", "max_over_time",
               "sum_over_time", "count_over_time", "last_over_time", "quantile_over_time", "stddev_over_time",
               "stdvar_over_time", "present_over_time", "absent_over_time", "absent"}
SCALAR_FUNCS = {"scalar", "time", "pi"}
SET_OPS = {"and", "or", "unless"}
TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*') | (?P<dur>\[[^\]]*\]) |
    (?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?) | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*) |
    (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^(){},=<>])""", re.X)


class PromQLError(AssertionError):
    pass


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]]


def tokenize(expr: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(expr):
        mt = TOKEN.match(expr, i)
        if not mt:
            raise PromQLError(f"cannot tokenize {expr[i:i + 20]!r} in {expr!r}")
        i = mt.end()
        if mt.lastgroup != "ws":
            out.append((mt.lastgroup, mt.group()))
    return out


class Checker:
    """Recursive descent over the PromQL subset a dashboard uses. Each sub-expression yields the set of label
    names its series carry (None for a scalar); every problem found is appended to ``errors``."""

    def __init__(self, expr: str, exposed: Exposed):
        self.expr, self.exposed = expr, exposed
        self.toks = tokenize(expr)
        self.i = 0
        self.errors: list[str] = []
        self.selectors: list[Selector] = []

    def run(self) -> list[str]:
        self.expression()
        if self.i != len(self.toks):
            raise PromQLError(f"trailing {self.toks[self.i:]} in {self.expr!r}")
        return self.errors

    # tokens
    def peek(self, k: int = 0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None)

    def take(self, value: str | None = None):
        t = self.peek()
        if t[0] is None or (value is not None and t[1] != value):
            raise PromQLError(f"expected {value!r}, got {t[1]!r} in {self.expr!r}")
        self.i += 1
        return t

    def label_list(self) -> list[str]:
        self.take("(")
        out = []
        while self.peek()[1] != ")":
            out.append(self.take()[1])
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return out

    # grammar
    BINOPS = ("or", "unless", "and", "==", "!=", ">=", "<=", ">", "<", "+", "-", "*", "/", "%", "^")

    def expression(self):
        left = self.unary()
        while self.peek()[1] in self.BINOPS:
            op = self.take()[1]
            if self.peek()[1] == "bool":
                self.take()
            on = ignoring = None
            if self.peek()[1] in ("on", "ignoring"):
                kw = self.take()[1]
                if kw == "on":
                    on = self.label_list()
                else:
                    ignoring = self.label_list()
            if self.peek()[1] in ("group_left", "group_right"):
                self.take()
                if self.peek()[1] == "(":
                    self.label_list()
            right = self.unary()
            left = self.binary(op, left, right, on, ignoring)
        return left

    def binary(self, op, left, right, on, ignoring):
        if left is None or right is None:
            return left if right is None else right
        if op in SET_OPS and on is None and ignoring is None:
            return left | right if op == "or" else left
        if on is not None:
            for side in (left, right):
                for lab in set(on) - side:
                    self.errors.append(f"on({lab}) but one side of {op!r} has only labels {sorted(side)}")
            return left
        ignored = set(ignoring or ())
        if left - ignored != right - ignored:
            self.errors.append(f"the two sides of {op!r} carry different labels {sorted(left)} vs {sorted(right)}: "
                               "no series would match")
        return left

    def unary(self):
        if self.peek()[1] in ("-", "+"):
            self.take()
        return self.primary()

    def primary(self):
        kind, val = self.peek()
        if kind in ("num", "str"):
            self.take()
            return None
        if val == "(":
            self.take("(")
            out = self.expression()
            self.take(")")
            return self.range_suffix(out)
        if kind != "ident":
            raise PromQLError(f"unexpected {val!r} in {self.expr!r}")
        if val in AGGREGATORS:
            return self.aggregation()
        if self.peek(1)[1] == "(":
            return self.call()
        return self.selector()

    def range_suffix(self, labels):
        if self.peek()[0] == "dur":
            self.take()
        if self.peek()[1] == "offset":
            self.take()
            self.take()
        return labels

    def aggregation(self):
        name = self.take()[1]
        grouping = None
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        self.take("(")
        if name in ("topk", "bottomk", "quantile", "count_values", "limitk", "limit_ratio"):
            self.expression()
            self.take(",")
        inner = self.expression()
        self.take(")")
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        inner = inner or set()
        if grouping is None:
            return set()
        kw, labs = grouping
        for lab in labs:
            if lab not in inner:
                self.errors.append(f"{name} {kw} ({lab}): the aggregated series carry only {sorted(inner)}")
        return set(labs) & inner if kw == "by" else inner - set(labs)

    def call(self):
        name = self.take()[1]
        self.take("(")
        args = []
        while self.peek()[1] != ")":
            args.append(self.expression())
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        vectors = [a for a in args if a is not None]
        if name == "histogram_quantile":
            if len(args) != 2 or args[1] is None:
                raise PromQLError(f"histogram_quantile needs (φ, buckets) in {self.expr!r}")
            if "le" not in args[1]:
                self.errors.append(f"histogram_quantile over series without 'le' (labels {sorted(args[1])})")
            return args[1] - {"le"}
        if name in SCALAR_FUNCS:
            return None
        if name == "vector":
            return set()
        if name in KEEP_LABELS:
            return vectors[0] if vectors else set()
        raise PromQLError(f"function {name!r} not known to this checker ({self.expr!r})")

    def selector(self):
        metric = self.take()[1]
        matchers = []
        if self.peek()[1] == "{":
            self.take("{")
            while self.peek()[1] != "}":
                lab = self.take()[1]
                op = self.take()[1]
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"bad matcher operator {op!r} in {self.expr!r}")
                raw = self.take()[1]
                matchers.append((lab, op, raw[1:-1]))
                if self.peek()[1] == ",":
                    self.take(",")
            self.take("}")
        sel = Selector(metric, matchers)
        self.selectors.append(sel)
        have = self.exposed.labels.get(metric)
        if have is None:
            self.errors.append(f"metric {metric!r} is not exposed by the controller")
            return self.range_suffix(set())
        for lab, op, val in matchers:
            if lab not in have:
                self.errors.append(f"{metric} has no label {lab!r} (it has {sorted(have)})")
                continue
            seen = self.exposed.values.get(metric, {}).get(lab, set())
            if op in ("=", "!=") and "$" not in val and val not in seen:
                self.errors.append(f"{metric}{{{lab}{op}{val!r}}}: the controller never sets {lab}={val!r} "
                                   f"(it sets {sorted(seen)})")
            if op in ("=~", "!~") and "$" not in val and re.fullmatch(r"[\w|]+", val):
                for alt in val.split("|"):
                    if alt not in seen:
                        self.errors.append(f"{metric}{{{lab}{op}{val!r}}}: {alt!r} is never set (it sets {sorted(seen)})")
        return self.range_suffix(set(have))


def variables_in(expr: str) -> set[str]:
    return {a or b or c for a, b, c in re.findall(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", expr)}


def substitute(expr: str) -> str:
    """Grafana interpolation, for parsing: a variable in a range becomes a duration, elsewhere a plain value."""
    expr = re.sub(r"\[\s*(\$\{?\w+\}?|\[\[\w+\]\])\s*\]", "[5m]", expr)
    # Inside a string (a matcher's value) the variable stays as written; elsewhere it stands for a number.
    parts = re.split(r"(\"(?:\\.|[^\"\\])*\")", expr)
    return "".join(part if i % 2 else re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", "1", part)
                   for i, part in enumerate(parts))


def check(expr: str, exposed: Exposed) -> list[str]:
    return Checker(substitute(expr), exposed).run()


def selectors_of(expr: str, exposed: Exposed) -> list[Selector]:
    c = Checker(substitute(expr), exposed)
    c.run()
    return c.selectors


# -- what is checked -------------------------------------------------------------------------------------------

def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out += p.get("panels") or []
    return out


def dashboard_exprs(d: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in all_panels(d) for t in p.get("targets") or ()]


def variable_queries(d: dict) -> list[tuple[str, str]]:
    out = []
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((var["name"], q))
    return out


def label_values_errors(query: str, exposed: Exposed) -> list[str]:
    mt = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", query)
    if not mt:
        return [f"not a label_values(metric, label) query: {query!r}"]
    sel, label = mt.groups()
    c = Checker(substitute(sel), exposed)
    errors = c.run()
    for s in c.selectors:
        if s.metric in exposed.labels and label not in exposed.labels[s.metric]:
            errors.append(f"label_values over {s.metric} which has no label {label!r}")
    return errors


def dashboard_errors(d: dict, exposed: Exposed) -> list[str]:
    errors = [f"{title}: {e}" for title, expr in dashboard_exprs(d) for e in check(expr, exposed)]
    errors += [f"${name}: {e}" for name, q in variable_queries(d) for e in label_values_errors(q, exposed)]
    return errors


def structure_errors(d: dict) -> list[str]:
    errors = []
    panels = all_panels(d)
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)) or None in ids:
        errors.append(f"panel ids not unique: {ids}")
    defined = {var["name"] for var in d["templating"]["list"]}
    for p in panels:
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")) or g["x"] + g["w"] > 24:
            errors.append(f"panel {p.get('title')!r}: bad gridPos {g}")
        if p["type"] == "row":
            continue
        if p["type"] not in ("timeseries", "stat"):
            errors.append(f"panel {p['title']!r}: type {p['type']!r}")
        if not p.get("targets"):
            errors.append(f"panel {p['title']!r} has no targets")
        refs = [t.get("refId") for t in p.get("targets") or ()]
        if len(refs) != len(set(refs)) or None in refs:
            errors.append(f"panel {p['title']!r}: refIds {refs}")
        texts = [json.dumps(p.get("datasource"))] + [t.get("expr", "") + json.dumps(t.get("datasource"))
                                                     for t in p.get("targets") or ()]
        for used in set().union(*(variables_in(t) for t in texts)) - GRAFANA_BUILTINS - defined:
            errors.append(f"panel {p['title']!r} uses ${used}, which the dashboard does not define")
        if any(not t.get("expr") for t in p.get("targets") or ()):
            errors.append(f"panel {p['title']!r} has a target without expr")
    for var in d["templating"]["list"]:
        for used in variables_in(json.dumps(var.get("datasource"))) - defined:
            errors.append(f"variable ${var['name']} uses ${used}, which the dashboard does not define")
    # Cells must not overlap (Grafana would push them around on import).
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    errors.append(f"panels {cells[(x, y)]!r} and {p['title']!r} overlap at {(x, y)}")
                    break
                cells[(x, y)] = p["title"]
            else:
                continue
            break
    return errors


# -- tests ----------------------------------------------------------------------------------------------------

def test_the_exposition_holds_every_series_the_controller_produces(exposed):
    """The fixture really exercises the controller's label values (else the value checks below prove nothing)."""
    fams = exposed.families
    assert fams["nodewarm_phase_duration_seconds"] == "histogram"
    assert fams["nodewarm_leader"] == fams["nodewarm_workqueue_depth"] == "gauge"
    bucket = exposed.values["nodewarm_phase_duration_seconds_bucket"]
    assert bucket["phase"] == {"launch_to_register", "register_to_warm", "warm_to_untaint", "launch_to_ready"}
    assert bucket["nodepool"] == {POOL}
    assert exposed.labels["nodewarm_phase_duration_seconds_bucket"] == {"nodepool", "phase", "le"}
    assert exposed.values["nodewarm_deadlines_total"]["action"] == {"replace", "untaint", "keep", "not_replaced"}
    assert exposed.values["nodewarm_compile_cache_total"]["result"] == {"cold", "hit", "miss"}
    assert exposed.labels["nodewarm_taints_removed_total"] == {"nodepool"}
    assert exposed.labels["nodewarm_device_plugins_missing_toleration"] == {"profile"}


def test_the_histogram_supports_a_per_pool_quantile(exposed):
    """histogram_quantile(…, sum by (le, nodepool[, phase]) (…_bucket)) needs le, nodepool and phase on the buckets."""
    assert {"le", "nodepool", "phase"} <= exposed.labels["nodewarm_phase_duration_seconds_bucket"]
    for suffix in ("_sum", "_count"):
        assert exposed.labels["nodewarm_phase_duration_seconds" + suffix] == {"nodepool", "phase"}
    assert "+Inf" in exposed.values["nodewarm_phase_duration_seconds_bucket"]["le"]


def test_every_dashboard_query_uses_real_metric_names_labels_and_values(exposed):
    d = dashboard()
    exprs = dashboard_exprs(d)
    assert len(exprs) >= 15
    used = {s.metric for _, e in exprs for s in selectors_of(e, exposed)}
    # Every family the controller exposes has a panel.
    # (prometheus_client's 0.0.4 text format adds a gauge family "<name>_created" per counter/histogram.)
    families = {n for n in exposed.families if n.startswith("nodewarm_")
                and not (n.endswith("_created") and n[:-len("_created")] in exposed.families)}
    covered = {n for n in families if any(u == n or u.startswith(n + "_") for u in used)}
    assert covered == families, f"no panel for {sorted(families - covered)}"
    assert dashboard_errors(d, exposed) == []


def test_every_readme_example_query_uses_real_metric_names_labels_and_values(exposed):
    queries = json.loads(EXAMPLES.read_text())["queries"]
    assert len(queries) >= 10
    errors = [f"{q['question']}: {e}" for q in queries for e in check(q["expr"], exposed)]
    assert errors == []


def test_dashboard_structure_is_importable():
    d = dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    names = {var["name"]: var for var in d["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    assert names["nodepool"]["type"] == "query" and names["nodepool"]["multi"] and names["nodepool"]["includeAll"]
    assert any('nodepool=~"$nodepool"' in e for _, e in dashboard_exprs(d))
    for p in all_panels(d):
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
    assert structure_errors(d) == []


# -- the checks can fail ---------------------------------------------------------------------------------------

def _with_expr(d: dict, title: str, fn) -> dict:
    d = copy.deepcopy(d)
    for p in all_panels(d):
        if p["title"] == title:
            p["targets"][0]["expr"] = fn(p["targets"][0]["expr"])
            return d
    raise AssertionError(f"no panel {title!r}")


@pytest.mark.parametrize("title,mutate,expect", [
    ("Nodes warmed (taints removed), and taints put back",
     lambda e: e.replace("nodewarm_taints_removed_total", "nodewarm_taints_removed"),
     "'nodewarm_taints_removed' is not exposed"),
    ("Registration -> Warm, p50 / p95", lambda e: e.replace("_bucket", "_buckets"), "is not exposed"),
    ("Registration -> Warm, p50 / p95", lambda e: e.replace("by (le, nodepool)", "by (nodepool)"), "without 'le'"),
    ("Deadlines hit, by action", lambda e: e.replace("by (nodepool, action)", "by (nodepool, reason)"),
     "sum by (reason)"),
    ("Node replacements", lambda e: e.replace('action="replace"', 'action="replaced"'),
     "never sets action='replaced'"),
    ("Compile-cache hit ratio", lambda e: e.replace('result="hit"', 'outcome="hit"'), "has no label 'outcome'"),
    # The ratio's denominator still split by result: no series on the two sides would match.
    ("Compile-cache hit ratio", lambda e: "sum by (nodepool, result)".join(e.rsplit("sum by (nodepool)", 1)),
     "different labels"),
    ("p95 per phase and NodePool", lambda e: e.replace("le, nodepool, phase", "le, nodepool, stage"), "sum by (stage)"),
    ("Device plugins missing the toleration, per profile", lambda e: e.replace("profile", "nodepool"),
     "max by (nodepool)"),
])
def test_a_wrong_name_label_or_value_in_a_copied_dashboard_is_caught(exposed, title, mutate, expect):
    broken = _with_expr(dashboard(), title, mutate)
    errors = dashboard_errors(broken, exposed)
    assert any(expect in e for e in errors), errors


def test_broken_structure_is_caught():
    d = dashboard()
    bad = copy.deepcopy(d)
    panels = [p for p in bad["panels"] if p["type"] != "row"]
    panels[1]["id"] = panels[0]["id"]
    del panels[2]["gridPos"]["w"]
    panels[3]["targets"][0]["expr"] = panels[3]["targets"][0]["expr"].replace("$nodepool", "$pool")
    panels[4]["gridPos"] = dict(panels[5]["gridPos"])
    bad["templating"]["list"] = [x for x in bad["templating"]["list"] if x["name"] != "window"]
    errors = "\n".join(structure_errors(bad))
    assert "panel ids not unique" in errors
    assert "bad gridPos" in errors
    assert "overlap" in errors
    assert "$window, which the dashboard does not define" in errors
    nodatasource = copy.deepcopy(d)
    nodatasource["templating"]["list"] = [x for x in d["templating"]["list"] if x["name"] != "datasource"]
    assert any("$datasource" in e for e in structure_errors(nodatasource))


def test_a_variable_over_a_metric_without_the_label_is_caught(exposed):
    assert label_values_errors("label_values(nodewarm_phase_duration_seconds_count, nodepool)", exposed) == []
    assert label_values_errors("label_values(nodewarm_leader, nodepool)", exposed)
    assert label_values_errors("label_values(nodewarm_phase_duration_count, nodepool)", exposed)


# -- and against a controller that really ran -------------------------------------------------------------------

@pytest.mark.kube
def test_a_running_controllers_metrics_endpoint_matches_the_exercised_registry(kube, admin, k, exposed):
    """The real controller, after lifting a taint on the local kube-apiserver, serves on its --metrics-port the
    same metric names with the same label names as the registry the checks above use, and the dashboard's
    queries over what it produced hold against its own scrape."""
    from nodewarm.bootstrap.nodestatus import report_warm
    from nodewarm_dev.testenv.karpenter import KarpenterSim

    from support.controller_fixtures import TAINT as TAINT_KEY, installed, running, taint_keys, wait_for

    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(admin, metrics_port=0, bind_address="127.0.0.1") as c:
        n = sim.scale_up(inst.pool, node_name="node-6")
        report_warm(kube.api_client(kube.node_token("node-6")), "node-6", True, "WeightsVerified", "verified",
                    {CACHE_ANNOTATION: "cold", "nodewarm.io/compile-cache-reason": "NoBundle"})
        wait_for(lambda: TAINT_KEY not in taint_keys(k, n.node), what="readiness taint removed")
        wait_for(lambda: c.decisions, what="decision recorded")
        with urllib.request.urlopen(f"http://127.0.0.1:{c.metrics_port}/metrics", timeout=10) as r:
            real = parse_exposition(r.read().decode())
    produced = {name for name in real.labels if name.startswith("nodewarm_")}
    assert {"nodewarm_phase_duration_seconds_bucket", "nodewarm_taints_removed_total", "nodewarm_compile_cache_total",
            "nodewarm_api_writes_total", "nodewarm_leader"} <= produced
    for name in produced:
        assert name in exposed.labels, f"the running controller exposes {name}, the checked registry does not"
        assert real.labels[name] == exposed.labels[name], name
    assert real.values["nodewarm_phase_duration_seconds_bucket"]["nodepool"] == {inst.pool}
    assert real.values["nodewarm_compile_cache_total"]["result"] == {"cold"}
    # Queries over series this run produced, checked against this run's own scrape.
    d = dashboard()
    for title, expr in dashboard_exprs(d):
        errs = check(expr, real)
        if all(s.metric in real.labels for s in selectors_of(expr, real)):
            assert [e for e in errs if "never sets" not in e] == [], (title, errs)
