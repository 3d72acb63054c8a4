# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 — Speculative sampling vs the chunk-boundary baseline
#
# Across chunk size K and update frequency: L50 / L95 of both policies, the waste fraction w
# and the work amplification A (DiT calls relative to the baseline), on the committed trace
# sets (low, high, continuous) and Poisson updates. Wan1.3B timing (16 fps, r = 4) with the
# default affine cost (4 steps of the paper's H200 per-forward time). Also draws one timeline.
# Open `02_speculative_vs_baseline.ipynb` in Jupyter, or run
# `python notebooks/02_speculative_vs_baseline.py`; either writes into
# `results/notebooks/02_speculative_vs_baseline/` of the checkout.

# %%
import os
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from latsim.analysis.intervals import replication_bootstrap_se
from latsim.analysis.latency import percentile
from latsim.experiments.engine import (
    DEFAULT_COST,
    Experiment,
    run_experiment,
    write_experiment,
)
from latsim.viz.timeline import plot_timeline, select_run

try:
    from IPython.display import display  # tables as DataFrames in a notebook
except ImportError:  # run as a plain script
    display = print

# the checkout, wherever Jupyter (or python) was started: a notebook's kernel runs in its folder
HERE = Path(globals().get("__file__", "notebook")).resolve().parent
ROOT = next(p for p in (HERE, *HERE.parents) if (p / "pyproject.toml").is_file())
RESULTS = Path(os.environ.get("LATSIM_RESULTS", ROOT / "results"))  # tests redirect this
OUT = RESULTS / "notebooks" / "02_speculative_vs_baseline"
OUT.mkdir(parents=True, exist_ok=True)
TRACES = ROOT / "traces"

# %%
KS = (3, 7, 14, 21, 28)
WORKLOADS = {
    "low (1-2/min)": f"traces:{TRACES / 'low'}",
    "high (3-11/min)": f"traces:{TRACES / 'high'}",
    "poisson 0.5/s": "poisson:0.5",
    "continuous 1-4 Hz": f"traces:{TRACES / 'continuous'}",
}
rows = []
for label, spec in WORKLOADS.items():
    seeds = 10 if spec.startswith("poisson") else None
    exp = Experiment(Ks=KS, cost=DEFAULT_COST, updates=spec, seeds=seeds, seed=2)
    result = run_experiment(exp, jobs=2)
    for row in result.rows:
        # the pooled percentiles' bootstrap standard errors over the replications
        runs = result.runs[row["K"], row["policy"]]
        shown = [[c.L for c in run.conditions if c.displayed] for run in runs]
        se = {f"L{level}_se": replication_bootstrap_se(
            shown, lambda values, level=level: percentile(values, level))
            for level in (50, 95)}
        rows.append({"workload": label, "policy": row["policy"], "K": row["K"],
                     "T": row["T"], "C": round(row["C_mean"], 6),
                     **{k: (None if row[k] is None else round(row[k], 6))
                        for k in ("L_mean", "L50", "L95", "w", "A", "stall_pct",
                                  "busy_pct")},
                     **{k: (None if v is None else round(v, 6)) for k, v in se.items()},
                     "n_shown": row["n_displayed"], "n_superseded": row["n_superseded"]})
table = pd.DataFrame(rows)
table.to_csv(OUT / "sweep.csv", index=False)
display(table)

# %%
fig, axes = plt.subplots(2, 2, figsize=(11, 7))
colors = dict(zip(WORKLOADS, ("#1f77b4", "#ff7f0e", "#9467bd", "#d62728"), strict=True))
for ax, metric in zip(axes[0], ("L50", "L95"), strict=True):
    for label in WORKLOADS:
        for policy, ls in (("baseline", "--"), ("speculative", "-")):
            sel = table[(table["workload"] == label) & (table["policy"] == policy)]
            ax.errorbar(sel["K"], sel[metric], yerr=sel[f"{metric}_se"], ls=ls, marker="o",
                        ms=3, capsize=2, color=colors[label])
    ax.set_xlabel("K")
    ax.set_ylabel(f"{metric} (s)")
    ax.set_title(f"{metric} (± 1 SE): baseline dashed, speculative solid")
    ax.set_xticks(KS)
    ax.grid(alpha=0.3)
# one key for the colours (workloads) and one for the line styles (policies)
axes[0][0].legend(handles=[Line2D([], [], color=colors[label], marker="o", ms=3, label=label)
                           for label in WORKLOADS], fontsize=7, title="workload",
                  title_fontsize=7)
axes[0][1].legend(handles=[Line2D([], [], color="k", ls=ls, lw=1.5, label=policy)
                           for policy, ls in (("baseline", "--"), ("speculative", "-"))],
                  fontsize=7, title="policy", title_fontsize=7, handlelength=3)
spec = table[table["policy"] == "speculative"]
for ax, metric in zip(axes[1], ("w", "A"), strict=True):
    for label in WORKLOADS:
        sel = spec[spec["workload"] == label]
        ax.plot(sel["K"], sel[metric], "-o", ms=3, color=colors[label], label=label)
    ax.set_xlabel("K")
    ax.set_xticks(KS)
    ax.set_ylabel(metric)
    ax.set_title("waste fraction w" if metric == "w" else "work amplification A (calls ratio)")
    ax.grid(alpha=0.3)
axes[1][0].legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "speculative_vs_baseline.png", dpi=110, metadata={"Software": None})

# %% [markdown]
# ## One run, drawn as a timeline (K = 14, one high-frequency trace)

# %%
run_dir = OUT / "timeline_run"
if run_dir.exists():
    shutil.rmtree(run_dir)
one = Experiment(Ks=(14,), cost=DEFAULT_COST,
                 updates=f"trace:{TRACES / 'high' / 'high_003.jsonl'}")
write_experiment(run_experiment(one, jobs=1), run_dir)
for name in ("config.json", "summary.json", "summary.csv"):
    (run_dir / name).unlink()  # they hold the absolute trace path; the timeline infers δ
for policy in ("baseline", "speculative"):
    plot_timeline(select_run(run_dir, policy=policy), OUT / f"timeline_{policy}.png")
print("wrote", OUT)
