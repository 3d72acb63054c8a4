"""``latsim plan``'s surrogate against the exact fleet model, by candidate class.

Run: ``.venv/bin/python bench/plan_surrogate.py [FILE]`` (default ``examples/plan.toml``).
For every candidate the surrogate passes, the exact model (the file's own ``[run]``, as
the plan verifies) runs its fleet at the surrogate's sessions per node, and again at one
session more on the node count Erlang-B gives for it. Each run is judged as the plan
judges it (:func:`latsim.experiments.deployment.verify`). Rows group the candidates by
policy and by whether the node's DiT pool is one group (USP degree = GPUs per node) or
several groups sharing one queue:

- the surrogate's L95 and cost per viewer-hour error (exact − predicted, relative: worst
  under and worst over);
- how many candidates the exact model accepts at the surrogate's count, and how many it
  would also accept with one session more (where the surrogate is conservative).

Writes ``results/bench/plan_surrogate.json``; docs/plan.md holds :func:`markdown`'s table
of it (``tests/test_doc_times.py`` checks that). A model's check, not a speed figure: the
answer does not depend on the machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from latsim.experiments.deployment import fleet_nodes, load_deployment, screen_all, verify

os.environ.setdefault("LATSIM_CACHE_DIR", "off")
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench" / "plan_surrogate.json"
HEADER = ("| policy | DiT groups per node | candidates | L95 error | cost error | exact meets "
          "| also meets at n + 1 |\n|---|---|---|---|---|---|---|")


def _span(values: list[float]) -> str:
    """The worst under and worst over, as signed percentages."""
    return f"{min(values):+.1f} % to {max(values):+.1f} %" if values else "–"


def markdown(rows: list[dict]) -> str:
    """The table docs/plan.md holds, from the bench's rows."""
    lines = [HEADER]
    for row in rows:
        lines.append(f"| {row['policy']} | {row['groups']} | {row['candidates']} | "
                     f"{_span(row['L95_error_pct'])} | {_span(row['cost_error_pct'])} | "
                     f"{row['exact_meets']} | {row['meets_one_more']} |")
    return "\n".join(lines)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "examples/plan.toml"
    deployment = load_deployment(path)
    classes: dict[tuple[str, str], dict] = {}
    for row in screen_all(deployment):
        if row["verdict"] != "meets" or row.get("target_util") is not None:
            continue
        groups = "one" if row["usp"] == row["gpus_per_node"] else "several"
        entry = classes.setdefault((row["policy"], groups), {
            "policy": row["policy"], "groups": groups, "candidates": 0, "L95_error_pct": [],
            "cost_error_pct": [], "exact_meets": 0, "meets_one_more": 0, "runs": []})
        exact = verify(deployment, row)
        entry["candidates"] += 1
        entry["L95_error_pct"].append(100 * exact["error_L95"] / row["L95"])
        entry["cost_error_pct"].append(100 * exact["error_cost_per_viewer_hour"]
                                       / row["cost_per_viewer_hour"])
        more = None
        if exact["exact_verdict"] == "meets":
            entry["exact_meets"] += 1
            sessions = row["sessions_per_node"] + 1
            nodes, _ = fleet_nodes(deployment.peak_load, sessions, deployment.slo.blocking,
                                   exact=deployment.base.workload.population)
            if nodes is not None:
                more = verify(deployment, {**row, "sessions_per_node": sessions,
                                           "nodes": nodes})
                entry["meets_one_more"] += more["exact_verdict"] == "meets"
        entry["runs"].append({
            "K": row["K"], "usp": row["usp"], "sessions_per_node": row["sessions_per_node"],
            "nodes": row["nodes"], "L95": row["L95"], "exact_L95": exact["exact_L95"],
            "cost": row["cost_per_viewer_hour"],
            "exact_cost": exact["exact_cost_per_viewer_hour"],
            "exact_verdict": exact["exact_verdict"], "exact_failed": exact["exact_failed"],
            "one_more_verdict": None if more is None else more["exact_verdict"],
            "one_more_failed": None if more is None else more["exact_failed"]})
        print(f"{row['policy']:11} K={row['K']:<2} usp{row['usp']} n={row['sessions_per_node']}"
              f": exact {exact['exact_verdict']} {exact['exact_failed']}; n+1: "
              f"{'-' if more is None else more['exact_verdict'] + ' ' + more['exact_failed']}",
              flush=True)
    rows = sorted(classes.values(), key=lambda r: (r["policy"], r["groups"]))
    for row in rows:
        row["L95_error_pct"] = [round(v, 2) for v in row["L95_error_pct"]]
        row["cost_error_pct"] = [round(v, 2) for v in row["cost_error_pct"]]
    OUT.write_text(json.dumps({
        "command": f".venv/bin/python bench/plan_surrogate.py {path}",
        "file": path,
        "method": "every candidate the surrogate passes, verified exactly at its sessions "
                  "per node and at one more (the file's [run]); errors are exact − "
                  "predicted over predicted",
        "rows": rows}, indent=1) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
