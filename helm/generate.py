#!/usr/bin/env python3
"""Generate the chart's derived files and check they are in sync.

    python helm/generate.py            # write all
    python helm/generate.py --check    # exit 1 if anything is stale (used by the tests)

Derived files:

* ``helm/envpool-operator/files/envpool-dashboard.json`` -- the Grafana dashboard,
  built from the panel list below (code keeps ids, grid positions and the
  ``$namespace``/``$pool`` filters consistent);
* the values table in ``helm/envpool-operator/README.md`` (between the
  ``VALUES-TABLE`` markers), from the ``# --`` comments in values.yaml;
* ``manifests/install/envpool-operator.yaml`` -- ``helm template`` of the chart
  with default values for ``kubectl apply -f`` users (needs helm; found on PATH,
  in ``$HELM`` or in the tests/cluster cache).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HELM_DIR = Path(__file__).resolve().parent
REPO = HELM_DIR.parent
CHART = HELM_DIR / "envpool-operator"
DASHBOARD = CHART / "files" / "envpool-dashboard.json"
README = CHART / "README.md"
INSTALL = REPO / "manifests" / "install" / "envpool-operator.yaml"
INSTALL_NAMESPACE = "envpool-system"
INSTALL_RELEASE = "envpool-operator"
KUBE_VERSION = "v1.36.0"

# ---------------------------------------------------------------------------
# dashboard
# ---------------------------------------------------------------------------

POOL_SEL = 'namespace=~"$namespace", pool=~"$pool"'
RATE = "$__rate_interval"

# (title, unit, panel type, [(expr, legend)], description)
Panel = tuple[str, str, str, list[tuple[str, str]], str]

POOL_PANELS: list[Panel] = [
    ("Env steps / s", "ops", "timeseries",
     [(f"sum by (namespace, pool) (rate(envpool_env_steps_total{{{POOL_SEL}}}[{RATE}]))",
       "{{namespace}}/{{pool}}")],
     "Sub-env steps returned to trainers per second."),
    ("Polls / s", "ops", "timeseries",
     [(f"sum by (namespace, pool) (rate(envpool_polls_total{{{POOL_SEL}}}[{RATE}]))",
       "{{namespace}}/{{pool}}")],
     "recv/step_wait calls that returned results, per second."),
    ("Poll batch size p50 / p99", "short", "timeseries",
     [(f"histogram_quantile({q}, sum by (namespace, pool, le) "
       f"(rate(envpool_poll_batch_size_bucket{{{POOL_SEL}}}[{RATE}])))",
       f"{{{{namespace}}}}/{{{{pool}}}} p{int(q * 100)}") for q in (0.5, 0.99)],
     "Sub-envs returned per poll (dynamic batching)."),
    ("Poll wait p50 / p99", "s", "timeseries",
     [(f"histogram_quantile({q}, sum by (namespace, pool, le) "
       f"(rate(envpool_poll_wait_seconds_bucket{{{POOL_SEL}}}[{RATE}])))",
       f"{{{{namespace}}}}/{{{{pool}}}} p{int(q * 100)}") for q in (0.5, 0.99)],
     "Time a poll waited for ready sub-envs."),
    ("Env failures / s by reason", "ops", "timeseries",
     [(f"sum by (namespace, pool, reason) (rate(envpool_env_failures_total{{{POOL_SEL}}}[{RATE}]))",
       "{{namespace}}/{{pool}} {{reason}}")],
     "Sub-env failures: exception, actor_died, timeout."),
    ("Actor and env restarts", "short", "timeseries",
     [(f"sum by (namespace, pool) (increase(envpool_actor_restarts_total{{{POOL_SEL}}}[{RATE}]))",
       "{{namespace}}/{{pool}} actors"),
      (f"sum by (namespace, pool) (increase(envpool_env_restarts_total{{{POOL_SEL}}}[{RATE}]))",
       "{{namespace}}/{{pool}} envs")],
     "Env actors and sub-envs re-created after failures."),
    ("Envs by state", "short", "timeseries",
     [(f"sum by (namespace, pool, state) (envpool_envs{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}} {{state}}")],
     "Sub-envs running, restarting, failed."),
    ("Envs leased, free and desired", "short", "timeseries",
     [(f"sum by (namespace, pool) (envpool_pool_leased_envs{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}} leased"),
      (f"sum by (namespace, pool) (envpool_pool_free_envs{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}} free"),
      (f"sum by (namespace, pool) (envpool_pool_desired_envs{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}} desired")],
     "Leased by trainers, free to lease now (the autoscaling buffer), and spec.replicas "
     "(which spec.autoscaling or an HPA writes)."),
    ("Free envs (buffer)", "short", "stat",
     [(f"min by (namespace, pool) (envpool_pool_free_envs{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}}")],
     "Ready envs no trainer leases: at 0 the next trainer waits for new envs "
     "(alert EnvPoolBufferEmpty)."),
    ("Pool phase", "none", "state-timeline",
     [(f"max by (namespace, pool, phase) (envpool_pool_phase{{{POOL_SEL}}}) == 1",
       "{{namespace}}/{{pool}} {{phase}}")],
     "Phase reported by the operator (Pending, Provisioning, Ready, Degraded, Failed, Suspended)."),
    ("Head available (0: outage)", "none", "state-timeline",
     [(f"min by (namespace, pool, reason) (envpool_pool_head_available{{{POOL_SEL}}})",
       "{{namespace}}/{{pool}} {{reason}}")],
     "The head pod (GCS, pool server), from the EnvPool's HeadAvailable condition: 0 "
     "during an outage. HeadRecovering: GCS fault tolerance, the env actors and trainers' "
     "direct steps go on, leases and new attaches wait for the new head. HeadLost: no "
     "fault tolerance, every env is re-created."),
]

OPERATOR_PANELS: list[Panel] = [
    ("Operator reconciles / s by result", "ops", "timeseries",
     [(f"sum by (result) (rate(envpool_operator_reconciles_total[{RATE}]))", "{{result}}")],
     "Reconciles of EnvPools by result."),
    ("Operator reconcile errors", "short", "timeseries",
     [(f'sum by (result) (increase(envpool_operator_reconciles_total{{result!="success"}}[{RATE}]))',
       "{{result}}")],
     "Reconciles that did not succeed (retried with backoff)."),
    ("Operator reconcile duration p50 / p99", "s", "timeseries",
     [(f"histogram_quantile({q}, sum by (le) "
       f"(rate(envpool_operator_reconcile_duration_seconds_bucket[{RATE}])))",
       f"p{int(q * 100)}") for q in (0.5, 0.99)],
     "Time per reconcile."),
    ("Autoscaler resizes", "short", "timeseries",
     [(f"sum by (direction) (increase(envpool_operator_autoscale_writes_total[{RATE}]))",
       "{{direction}}")],
     "spec.replicas written by the autoscaler (spec.autoscaling) through the scale subresource."),
    ("Operator up", "none", "stat",
     [('up{job="envpool-operator"}', "{{instance}}")],
     "Scrape target of the operator (job=\"envpool-operator\")."),
]


def _panel(pid: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    title, unit, kind, targets, description = panel
    out: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
            for i, (expr, legend) in enumerate(targets)
        ],
    }
    if kind == "timeseries":
        out["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1,
                                                    "fillOpacity": 10}
    return out


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {"id": pid, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": True,
        # ".*" also matches series without the label (pools run out of cluster).
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0, "options": [], "regex": "",
    }


def build_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, group in (("Pools", POOL_PANELS), ("Operator", OPERATOR_PANELS)):
        panels.append(_row(pid, title, y))
        pid, y = pid + 1, y + 1
        for i, p in enumerate(group):
            panels.append(_panel(pid, p, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(group) + 1) // 2)
    return {
        "uid": "envpool-overview",
        "title": "EnvPool",
        "description": "EnvPool pools (polls, batching, failures, restarts, leases and buffer, "
                       "phase) and the operator.",
        "tags": ["envpool", "ray", "reinforcement-learning"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "regex": "",
             "options": [], "refresh": 1},
            _variable("namespace", "Namespace", "label_values(envpool_envs, namespace)"),
            _variable("pool", "Pool", 'label_values(envpool_envs{namespace=~"$namespace"}, pool)'),
        ]},
        "panels": panels,
    }


def dashboard_text() -> str:
    return json.dumps(build_dashboard(), indent=2) + "\n"


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every non-row panel."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] if p["type"] != "row"
            for t in p["targets"]]


# ---------------------------------------------------------------------------
# README values table
# ---------------------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def documented_values(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) for each ``# --`` documented key of values.yaml.

    A documented key whose value is a map is one row (its children are its
    default). Raises ValueError for a key that is neither documented nor a plain
    grouping map of documented keys.
    """
    rows: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of enclosing maps
    pending: list[str] | None = None
    documented_at: int | None = None  # indent of a documented map being skipped
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None and stripped.startswith("# "):
                pending.append(stripped[2:].strip())
            continue
        m = _KEY.match(line)
        if not m:
            continue
        indent = len(m.group("indent"))
        if documented_at is not None:
            if indent > documented_at:
                continue
            documented_at = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [m.group("key")])
        rest = m.group("rest").strip()
        if pending is not None:
            rows.append((key, " ".join(pending)))
            pending = None
            if rest == "":
                documented_at = indent
        elif rest == "":
            stack.append((indent, m.group("key")))
        else:
            raise ValueError(f"values.yaml:{lineno}: {key} has no '# --' comment")
    return rows


def _lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def values_table() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for key, desc in documented_values(text):
        value = _lookup(values, key)
        kind = {dict: "object", list: "list", bool: "bool", int: "int", float: "float",
                str: "string"}.get(type(value), "string")
        default = json.dumps(value).replace("|", r"\|")
        desc = desc.replace("|", r"\|")
        lines.append(f"| `{key}` | {kind} | `{default}` | {desc} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- VALUES-TABLE:BEGIN (helm/generate.py) -->", "<!-- VALUES-TABLE:END -->"


def readme_text() -> str:
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + values_table() + text[end:]


# ---------------------------------------------------------------------------
# plain manifests
# ---------------------------------------------------------------------------


def find_helm() -> str:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    cache = Path(os.environ.get("ENVPOOL_CLUSTER_CACHE", Path.home() / ".cache" / "envpool-cluster"))
    for cand in sorted(cache.glob("helm-*/bin/helm"), reverse=True):
        return str(cand)
    found = shutil.which("helm")
    if found:
        return found
    raise FileNotFoundError("helm not found: set $HELM, put it on PATH or run tests/cluster/build.sh")


def install_text(helm: str | None = None) -> str:
    """The plain install: Namespace + ``helm template`` (defaults, tests off)."""
    out = subprocess.run(
        [helm or find_helm(), "template", INSTALL_RELEASE, str(CHART),
         "--namespace", INSTALL_NAMESPACE, "--set", "tests.enabled=false",
         # a helm built with `go install` defaults to v1.20 (no version stamp)
         "--kube-version", KUBE_VERSION],
        check=True, capture_output=True, text=True,
    ).stdout
    # Helm's labels name helm as the manager; these files are applied by kubectl.
    out = out.replace("app.kubernetes.io/managed-by: Helm", "app.kubernetes.io/managed-by: kubectl")
    namespace = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": INSTALL_NAMESPACE, "labels": {
            "app.kubernetes.io/part-of": "envpool",
            # the operator pod meets the restricted Pod Security Standard
            "pod-security.kubernetes.io/enforce": "restricted"}},
    }, sort_keys=False)
    header = ("# Generated by helm/generate.py from helm/envpool-operator (default values) --\n"
              "# do not edit. Install: kubectl apply --server-side -f manifests/crd/ -f manifests/install/\n")
    return header + "---\n" + namespace + out


# ---------------------------------------------------------------------------


def targets() -> list[tuple[Path, Any]]:
    return [(DASHBOARD, dashboard_text), (README, readme_text), (INSTALL, install_text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, make in targets():
        want = make()
        have = path.read_text() if path.exists() else None
        if have == want:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want)
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print("stale (run python helm/generate.py): " + ", ".join(str(p.relative_to(REPO)) for p in stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
