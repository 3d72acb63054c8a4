# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 — The boundary wait
#
# Chunk-boundary commitment makes a condition wait for the next chunk boundary: with fixed
# generation time C and uniform arrival phase, E[R + Q] >= T/2, so E[L] >= C + T/2 even when
# C = 0 (the paper's Proposition 1). Here: L against the arrival phase for one setting, then
# simulated E[L] against C + T/2 over K. Open `01_boundary_wait.ipynb` in Jupyter, or run
# `python notebooks/01_boundary_wait.py`; either writes into
# `results/notebooks/01_boundary_wait/` of the checkout.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from latsim.analysis import theory
from latsim.experiments.engine import Experiment, run_experiment
from latsim.experiments.paper import phase_grid_conditions

try:
    from IPython.display import display  # tables as DataFrames in a notebook
except ImportError:  # run as a plain script
    display = print

# the checkout, wherever Jupyter (or python) was started: a notebook's kernel runs in its folder
HERE = Path(globals().get("__file__", "notebook")).resolve().parent
ROOT = next(p for p in (HERE, *HERE.parents) if (p / "pyproject.toml").is_file())
RESULTS = Path(os.environ.get("LATSIM_RESULTS", ROOT / "results"))  # tests redirect this
OUT = RESULTS / "notebooks" / "01_boundary_wait"
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## L against the arrival phase (Wan1.3B timing: 16 fps, r = 4, K = 21, T = 5.25 s)
# One simulated run per arrival phase u in [0, T) (400 phases): baseline L falls linearly
# from C + T to C over the chunk; speculative L stays near C + δ/2 except while the worker
# is busy refilling (the last C of each T), where it waits out the refill (eq. 6).

# %%
K, R_, FPS, C = 21, 4, 16.0, 0.8
T = K * R_ / FPS
PHASES = 400
rows = []
for policy in ("baseline", "speculative"):
    for i, cond in enumerate(phase_grid_conditions(K, R_, FPS, C, policy, PHASES)):
        rows.append({"policy": policy, "phase": round((i + 0.5) / PHASES * T, 6),
                     "R": round(cond.R, 6), "C": round(cond.C, 6), "Q": round(cond.Q, 6),
                     "L": round(cond.L, 6)})
phase = pd.DataFrame(rows)
phase.to_csv(OUT / "latency_vs_phase.csv", index=False)
means = phase.groupby("policy")["L"].mean()
print("E[L] over phase:", means.round(4).to_dict())
print("theory: baseline C + T/2 =", round(theory.baseline_latency_lower_bound(C, T), 4),
      "; speculative (eq. 6 + Q) =",
      round(theory.speculative_latency_mean(C, T, R_ / FPS), 4))
assert means["baseline"] >= C + T / 2 - 1e-6

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for policy, color in (("baseline", "#7f7f7f"), ("speculative", "#2ca02c")):
    sel = phase[phase["policy"] == policy]
    ax.plot(sel["phase"], sel["L"], ".", ms=2, color=color, label=f"{policy} L")
ax.axhline(C + T / 2, color="#7f7f7f", ls="--", label="C + T/2 (baseline mean)")
ax.axhline(theory.speculative_latency_mean(C, T, R_ / FPS), color="#2ca02c", ls="--",
           label="eq. 6 + Q (speculative mean)")
ax.axvspan(T - C, T, color="#1f77b4", alpha=0.1, label="worker busy (refill)")
ax.set_xlabel("arrival phase within the chunk (s)")
ax.set_ylabel("latency L (s)")
ax.set_title(f"K={K}, T={T:g} s, C={C:g} s")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "latency_vs_phase.png", dpi=110, metadata={"Software": None})

# %% [markdown]
# ## E[L] >= C + T/2 over K, with C = 0 included
# Baseline under Poisson updates (0.1/s, 30 × 120 s per point); C = 0 still leaves T/2.

# %%
KS = (1, 3, 7, 14, 21, 42)
bound_rows = []
for c in (0.0, 0.4):
    exp = Experiment(Ks=KS, r=R_, fps=FPS, cost=f"fixed:{c!r}", policies=("baseline",),
                     updates="poisson:0.1", duration=120.0, seeds=30, seed=1)
    for row in run_experiment(exp, jobs=1).rows:
        bound_rows.append({"C": c, "K": row["K"], "T": row["T"],
                           "L_mean": round(row["L_mean"], 6),
                           "L_mean_se": round(row["L_mean_se"], 6),
                           "bound": round(theory.baseline_latency_lower_bound(c, row["T"]), 6)})
bound = pd.DataFrame(bound_rows)
bound.to_csv(OUT / "mean_latency_vs_bound.csv", index=False)
display(bound)

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for c, color in ((0.0, "#1f77b4"), (0.4, "#ff7f0e")):
    sel = bound[bound["C"] == c]
    ax.errorbar(sel["T"], sel["L_mean"], yerr=2 * sel["L_mean_se"], fmt="o", color=color,
                label=f"simulated baseline, C={c:g}")
    ax.plot(sel["T"], sel["bound"], "-", color=color, label=f"C + T/2, C={c:g}")
ax.set_xlabel("chunk play time T (s)")
ax.set_ylabel("mean latency (s)")
ax.set_title("Chunk-boundary commitment: E[L] >= C + T/2")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "mean_latency_vs_bound.png", dpi=110, metadata={"Software": None})
print("wrote", OUT)
