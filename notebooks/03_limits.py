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
# # 03 — The limits: C → T and C > T
#
# Speculative sampling removes the boundary wait, but the residual wait of eq. (6),
# E[R] = C²/(2T), grows with C: at C = T the worker is always busy, E[R] = T/2, Q = 0 and
# E[L] = 3T/2, the baseline's value — no gain. Past C = T one worker cannot keep up and the
# player stalls a fraction 1 − T/C of the time (the paper's LTX short-chunk eager case).
# LTX-2.3 long-chunk timing: 24 fps, r = 8, K = 15, T = 5 s, rare Poisson updates.
# Open `03_limits.ipynb` in Jupyter, or run `python notebooks/03_limits.py`; either writes
# into `results/notebooks/03_limits/` of the checkout.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from latsim.analysis import theory
from latsim.experiments.engine import Experiment, run_experiment

try:
    from IPython.display import display  # tables as DataFrames in a notebook
except ImportError:  # run as a plain script
    display = print

# the checkout, wherever Jupyter (or python) was started: a notebook's kernel runs in its folder
HERE = Path(globals().get("__file__", "notebook")).resolve().parent
ROOT = next(p for p in (HERE, *HERE.parents) if (p / "pyproject.toml").is_file())
RESULTS = Path(os.environ.get("LATSIM_RESULTS", ROOT / "results"))  # tests redirect this
OUT = RESULTS / "notebooks" / "03_limits"
OUT.mkdir(parents=True, exist_ok=True)

K, R_, FPS = 15, 8, 24.0
T, DELTA = K * R_ / FPS, R_ / FPS
RATIOS = (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)

# %%
rows = []
for ratio in RATIOS:
    c = round(ratio * T, 9)
    exp = Experiment(Ks=(K,), r=R_, fps=FPS, cost=f"fixed:{c!r}", updates="poisson:0.02",
                     duration=600.0, seeds=16, seed=3)
    sim = {row["policy"]: row for row in run_experiment(exp, jobs=2).rows}
    spec_theory = theory.speculative_latency_mean(c, T, DELTA) if c <= T else None
    rows.append({
        "C_over_T": ratio, "C": c,
        "baseline_L_mean": round(sim["baseline"]["L_mean"], 6),
        "speculative_L_mean": round(sim["speculative"]["L_mean"], 6),
        "speculative_R_mean": round(sim["speculative"]["R_mean"], 6),
        "theory_baseline_L_mean": round(c + T / 2, 6),
        "theory_speculative_L_mean": None if spec_theory is None else round(spec_theory, 6),
        "theory_E_R": round(theory.residual_wait_mean(c, T), 6) if c <= T else None,
        "sim_stall_pct": round(sim["speculative"]["stall_pct"], 6),
        "theory_stall_pct": round(100 * theory.stall_fraction(c, T), 6),
        "busy_pct": round(sim["speculative"]["busy_pct"], 6),
    })
limits = pd.DataFrame(rows)
limits.to_csv(OUT / "limits.csv", index=False)
display(limits)
at_t = limits[limits["C_over_T"] == 1.0].iloc[0]
print(f"C = T: baseline {at_t.baseline_L_mean:.3f}, speculative {at_t.speculative_L_mean:.3f}, "
      f"3T/2 = {theory.saturated_latency_mean(T):.3f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
ax1.plot(limits["C_over_T"], limits["baseline_L_mean"], "o", color="#7f7f7f",
         label="baseline (sim)")
ax1.plot(limits["C_over_T"], limits["speculative_L_mean"], "x", color="#2ca02c",
         label="speculative (sim)")
grid = np.linspace(0.0, 1.0, 101)
ax1.plot(grid, grid * T + T / 2, "-", color="#7f7f7f", label="C + T/2")
ax1.plot(grid, [theory.speculative_latency_mean(g * T, T, DELTA) for g in grid], "-",
         color="#2ca02c", label="eq. 6 + Q")
ax1.axhline(theory.saturated_latency_mean(T), color="black", ls=":", label="3T/2")
ax1.set_xlabel("C / T")
ax1.set_ylabel("mean latency (s)")
ax1.set_title(f"the gain closes as C → T (K={K}, T={T:g} s)")
ax1.legend(fontsize=7)
ax1.grid(alpha=0.3)
ax2.plot(limits["C_over_T"], limits["sim_stall_pct"], "o", label="simulated")
ratios = np.linspace(0.05, 2.0, 200)
ax2.plot(ratios, [100 * theory.stall_fraction(q * T, T) for q in ratios], "-",
         label="100 (1 − T/C)")
ax2.set_xlabel("C / T")
ax2.set_ylabel("stall %")
ax2.set_title("C > T: one worker cannot keep up")
ax2.legend(fontsize=7)
ax2.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(OUT / "limits.png", dpi=110, metadata={"Software": None})
print("wrote", OUT)
