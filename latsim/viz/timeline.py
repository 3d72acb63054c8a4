"""The timeline figure (like the paper's Figures 1–2), drawn only from a run folder's CSVs.

A run folder (:mod:`latsim.run.folder`: an experiment, a simulated or a measured run) holds
``jobs.csv``, ``slots.csv``, ``discards.csv``, ``conditions.csv`` and ``stalls.csv`` with
``policy, K, run`` columns first. Nothing here touches the simulator, so the figure works
unchanged on measured runs. pandas and matplotlib are imported inside the functions.

A partial run (:attr:`latsim.run.folder.RunFolder.state` other than ``complete``: interrupted,
failed, or left ``incomplete`` by a killed writer) says so in the figure's title, with the time
its records end (the ``end_time`` it stated, else its last finished job), which is marked on
the time axis; a torn last CSV row, dropped on reading, is noted there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latsim.errors import LatsimError
from latsim.run.folder import COMPLETE, RunFolder, read_run_folder

RECORD_FILES = ("jobs", "slots", "discards", "conditions", "stalls")
REQUIRED = ("jobs", "slots")


@dataclass(frozen=True)
class RunData:
    """One (policy, K, run) selection of a run folder's records, as pandas DataFrames."""

    policy: str
    K: int
    run: int
    delta: float
    eager: bool
    jobs: Any
    slots: Any
    discards: Any
    conditions: Any
    stalls: Any
    status: str = COMPLETE  # the folder's state (RunFolder.state); "records" if unknown
    end_time: float | None = None  # where a partial run's records end
    duration: float | None = None  # the run's window
    notes: tuple[str, ...] = ()  # e.g. a torn last row dropped
    stream: int | None = None  # a serving folder's stream

    @property
    def T(self) -> float:  # noqa: N802 - the paper's symbol
        return self.K * self.delta

    @property
    def partial(self) -> bool:
        """Not known to be complete: stopped early, or bare records whose writer left no
        config or summary to say whether it finished."""
        return self.status != COMPLETE

    def status_line(self) -> str:
        """``""`` for a complete run; else what kind of partial run and where it ends."""
        parts = []
        if self.status == "records":
            parts.append("RECORDS ONLY (no config.json or summary.json: whether the run "
                         "finished is unknown)")
        elif self.partial:
            where = ""
            if self.end_time is not None:
                where = f": records end at {self.end_time:.2f} s" + (
                    "" if self.duration is None else f" of the {self.duration:g} s window")
            parts.append(f"PARTIAL RUN ({self.status}{where})")
        parts.extend(self.notes)
        return "; ".join(parts)


def _select(frame, policy: str | None, K: int | None, run: int | None,  # noqa: N803
            stream: int | None = None):
    if frame.empty:
        return frame
    mask = None
    for column, value in (("policy", policy), ("K", K), ("run", run), ("stream", stream)):
        if value is not None and column in frame.columns:
            hit = frame[column] == value
            mask = hit if mask is None else mask & hit
    return frame if mask is None else frame[mask].reset_index(drop=True)


def _infer_delta(slots, folder: RunFolder) -> float:
    config = folder.config
    if config.get("r") and config.get("fps"):
        return float(config["r"]) / float(config["fps"])
    starts = slots.sort_values("position")["t_start"].diff().dropna()
    starts = starts[starts > 1e-9]
    if starts.empty:
        raise LatsimError(f"{folder.path}: cannot infer the slot length δ (too few slots)")
    return float(starts.min())


def select_run(run_dir: str | Path, policy: str | None = None, K: int | None = None,  # noqa: N803
               run: int | None = None, stream: int | None = None) -> RunData:
    """Read a run folder (:mod:`latsim.run.folder`) and select one (policy, K, run) and, in
    a serving folder (records with a ``stream`` column), one stream; ``None`` picks the
    first present."""
    folder = read_run_folder(run_dir)
    for name in REQUIRED:
        if not (folder.path / f"{name}.csv").exists():
            raise LatsimError(f"{folder.path / (name + '.csv')}: missing "
                              "(a run folder needs jobs.csv and slots.csv)")
    frames = {name: folder.frame(name) for name in RECORD_FILES}
    jobs = frames["jobs"]
    if jobs.empty:
        raise LatsimError(f"{folder.path / 'jobs.csv'}: no job records")
    if policy is not None and "policy" in jobs.columns and policy not in set(jobs["policy"]):
        raise LatsimError(f"{run_dir}: no policy {policy!r} (have "
                          f"{', '.join(sorted(set(jobs['policy'])))})")
    first = jobs.iloc[0]
    policy = policy if policy is not None else str(first.get("policy", "run"))
    sel = _select(jobs, policy, None, None)
    if K is None:
        K = int(sel.iloc[0]["K"]) if "K" in sel.columns else int(sel["length"].max())  # noqa: N806
    sel = _select(sel, None, K, None)
    if sel.empty:
        raise LatsimError(f"{run_dir}: no records for policy {policy!r} with K={K}")
    if run is None:
        run = int(sel.iloc[0]["run"]) if "run" in sel.columns else 0
    if "stream" in sel.columns:
        stream = int(sel.iloc[0]["stream"]) if stream is None else stream
    elif stream is not None:
        raise LatsimError(f"{run_dir}: not a serving folder (no stream column); drop --stream")
    picked = {name: _select(frame, policy, K, run, stream) for name, frame in frames.items()}
    if picked["jobs"].empty or picked["slots"].empty:
        raise LatsimError(f"{run_dir}: no records for policy {policy!r}, K={K}, run {run}"
                          + ("" if stream is None else f", stream {stream}"))
    delta = _infer_delta(picked["slots"], folder)
    if folder.kind in ("simulated", "measured"):
        eager = folder.config.get("commit") == "eager"
    else:  # an experiment's "commit" overrides the speculative policy only
        eager = policy == "baseline" or folder.config.get("commit") == "eager"
    notes = tuple(frame.attrs["torn"] for frame in frames.values()
                  if frame.attrs.get("torn"))
    status, end_time, duration = "records", None, None
    if folder.kind != "records":
        status = folder.state
        duration = folder.duration if "duration" in folder.config else None
        if status != COMPLETE:
            end_time = folder.end_time
            if end_time is None and folder.kind != "experiment":
                end_time = folder.records_end()
    return RunData(policy, int(K), int(run), delta, eager, picked["jobs"], picked["slots"],
                   picked["discards"], picked["conditions"], picked["stalls"], status,
                   end_time, duration, notes, stream)


def default_window(data: RunData) -> tuple[float, float]:
    """Around the first shown condition (1.5 T either side), else the first 4 T."""
    conds = data.conditions
    if not conds.empty and "displayed" in conds.columns:
        shown = conds[conds["displayed"].astype(str) == "True"]
        if not shown.empty:
            first = shown.iloc[0]
            return max(0.0, float(first["t_arrival"]) - 1.5 * data.T), float(
                first["t_play"]) + 1.5 * data.T
    return 0.0, 4 * data.T


def _version_color(version: int):
    import matplotlib

    if version <= 0:
        return "#b0b0b0"  # V0: the prebuffer, grey as in the paper's figures
    return matplotlib.colormaps["tab10"]((version - 1) % 10)


def plot_timeline(data: RunData, out: str | Path, t0: float | None = None,
                  t1: float | None = None) -> Path:
    """Draw the timeline of ``data`` between ``t0`` and ``t1`` into the PNG ``out``."""
    import matplotlib.pyplot as plt

    path = Path(out)
    if path.is_dir():
        path = path / "timeline.png"
    elif path.suffix.lower() != ".png":  # matplotlib would add .png and we would say out
        raise LatsimError(f"--out {out}: give a .png path or an existing folder")
    fig = timeline_figure(data, t0, t1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path


def timeline_figure(data: RunData, t0: float | None = None, t1: float | None = None):
    """The figure of :func:`plot_timeline` (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lo, hi = default_window(data)
    t0 = lo if t0 is None else t0
    t1 = hi if t1 is None else t1
    if not t1 > t0:
        raise LatsimError(f"the window needs t1 > t0, got t0={t0:g}, t1={t1:g}")
    delta, K = data.delta, data.K  # noqa: N806
    jobs = data.jobs
    slots = data.slots
    discards = data.discards
    conds = data.conditions
    fig, (ax_time, ax_pos) = plt.subplots(
        2, 1, figsize=(12, 7.5), sharex=True, gridspec_kw={"height_ratios": [1.1, 1.6]}
    )

    # --- lanes over time: generator, playback, conditions
    y_gen, y_play, y_cond = 2.0, 1.0, 0.0
    discarded_by_job: dict[int, int] = {}
    if not discards.empty:
        for job_id, count in discards.groupby("job_id")["count"].sum().items():
            discarded_by_job[int(job_id)] = int(count)
    for job in jobs.itertuples():
        if job.kind == "prebuffer" or job.t_ready < t0 or job.t_start > t1:
            continue
        width = job.t_ready - job.t_start
        color = _version_color(int(job.version))
        ax_time.broken_barh([(job.t_start, width)], (y_gen - 0.35, 0.7), facecolors=color,
                            edgecolor="black", linewidth=0.6)
        lost = discarded_by_job.get(int(job.job_id), 0)
        if lost:
            share = lost / max(1, int(job.length))
            ax_time.broken_barh([(job.t_ready - share * width, share * width)],
                                (y_gen - 0.35, 0.7), facecolors="none", hatch="////",
                                edgecolor="black", linewidth=0)
        narrow = width < 0.07 * (t1 - t0)  # the label would overprint: above the bar
        ax_time.text(job.t_start + width / 2, y_gen + (0.5 if narrow else 0.0),
                     f"{job.kind} v{int(job.version)}", ha="center", va="center",
                     fontsize=5 if narrow else 6, clip_on=True)
    visible = slots[(slots["t_start"] + delta >= t0) & (slots["t_start"] <= t1)]
    for version, group in visible.groupby("version"):
        ax_time.broken_barh([(t, delta) for t in group["t_start"]], (y_play - 0.35, 0.7),
                            facecolors=_version_color(int(version)), edgecolor="white",
                            linewidth=0.3)
    if not data.stalls.empty:
        for stall in data.stalls.itertuples():
            for ax in (ax_time, ax_pos):
                ax.axvspan(stall.t_start, stall.t_end, color="#d62728", alpha=0.15, lw=0)

    shown = conds
    if not conds.empty and "displayed" in conds.columns:
        shown = conds[conds["displayed"].astype(str) == "True"]
    for cond in (shown.itertuples() if not shown.empty else []):
        if cond.t_play < t0 or cond.t_arrival > t1:
            continue
        superseded = str(cond.superseded) == "True"
        for ax in (ax_time, ax_pos):
            ax.axvline(cond.t_arrival, color=_version_color(int(cond.version)), ls="--",
                       lw=0.9)
        segments = (("R", cond.t_arrival, cond.t_start, "#ff7f0e"),
                    ("C", cond.t_start, cond.t_ready, "#1f77b4"),
                    ("Q", cond.t_ready, cond.t_play, "#9467bd"))
        for label, a, b, color in segments:
            if b - a > 1e-9:
                ax_time.broken_barh([(a, b - a)], (y_cond - 0.25, 0.5), facecolors=color,
                                    alpha=0.6 if superseded else 0.9)
                ax_time.text((a + b) / 2, y_cond, f"{label} {b - a:.2f}", ha="center",
                             va="center", fontsize=6, color="white", clip_on=True)
        ax_time.plot([cond.t_play], [y_cond], marker="v", color="black", ms=6)
        ax_time.text(cond.t_play, y_cond + 0.35,
                     f"v{int(cond.version)} shown, L={cond.L:.2f} s"
                     + (" (superseded)" if superseded else ""), fontsize=6, clip_on=True)
    ax_time.set_yticks([y_cond, y_play, y_gen], ["conditions\n(R, C, Q)", "playback",
                                                 "generator\njobs"])
    ax_time.set_ylim(-0.6, 2.6)
    status = data.status_line()
    of_run = "" if data.duration is None else f" of a {data.duration:g} s run"
    where = f"run {data.run}" + ("" if data.stream is None else f", stream {data.stream}")
    ax_time.set_title(f"{data.policy}: K={K}, δ={delta:.3f} s, T={data.T:.2f} s, {where}; "
                      f"shown: {t0:g}–{t1:g} s{of_run}\n(colour = condition version, grey = "
                      f"V0; hatched = discarded part; red = stall)"
                      + (f"\n{status}" if status else ""),
                      fontsize=9, color="#b00000" if data.partial else "black")
    ax_time.tick_params(labelbottom=True)  # its own time axis, not only the lower panel's
    if data.partial and data.end_time is not None and data.end_time < t1:
        for ax in (ax_time, ax_pos):
            ax.axvspan(max(t0, data.end_time), t1, color="#808080", alpha=0.12, lw=0)
            ax.axvline(data.end_time, color="#b00000", lw=1.2)
        ax_time.text(data.end_time, 2.45, f" records end ({data.status})", fontsize=7,
                     color="#b00000", va="center", clip_on=True)

    # --- content positions over time: prediction cache, locked prefix, replaceable future
    played_at = dict(zip(slots["position"], slots["t_start"], strict=False))
    played_job = dict(zip(slots["position"], slots["job_id"], strict=False))
    discard_rows = [] if discards.empty else list(discards.itertuples())
    for job in jobs.itertuples():
        if job.t_ready > t1:
            continue
        color = _version_color(int(job.version))
        for pos in range(int(job.branch), int(job.branch) + int(job.length)):
            gone = next((d.t for d in discard_rows if d.job_id == job.job_id
                         and d.first <= pos < d.first + d.count), None)
            if played_job.get(pos) == job.job_id:
                end = played_at[pos]
            elif gone is not None:
                end = gone
            else:
                continue
            if end < t0:
                continue
            if gone is not None:
                ax_pos.plot([job.t_ready, end], [pos, pos], color=color, lw=1.2, ls=":")
                ax_pos.plot([end], [pos], marker="x", color=color, ms=3)
            else:
                ax_pos.plot([job.t_ready, end], [pos, pos], color=color, lw=2.2,
                            alpha=1.0 if data.eager else 0.45)
                ax_pos.broken_barh([(end, delta)], (pos - 0.4, 0.8), facecolors=color)
    branch_of = dict(zip(jobs["job_id"], jobs["branch"], strict=False))
    for cond in (shown.itertuples() if not shown.empty else []):
        if not t0 <= cond.t_arrival <= t1 or int(cond.job_id) not in branch_of:
            continue
        branch = int(branch_of[int(cond.job_id)])
        before = slots[slots["t_start"] <= cond.t_arrival]
        head = int(before["position"].max()) if not before.empty else 0
        ax_pos.plot([cond.t_arrival] * 2, [head, branch - 0.5], color="black", lw=3,
                    solid_capstyle="butt")
        ax_pos.plot([cond.t_arrival] * 2, [branch - 0.5, branch + K - 0.5], color="black",
                    lw=1.2, ls=(0, (1, 1)))
        ax_pos.text(cond.t_arrival, (head + branch) / 2, " locked prefix", fontsize=6,
                    va="center")
        ax_pos.text(cond.t_arrival, branch + K / 2, " replaceable future → branch "
                    f"{branch}", fontsize=6, va="center")
    ax_pos.step(slots["t_start"], slots["position"], where="post", color="black", lw=0.8)
    low = visible["position"].min() if not visible.empty else 0
    high = visible["position"].max() if not visible.empty else K
    ax_pos.set_ylim(low - 1, high + 2 * K)
    ax_pos.set_ylabel("latent position")
    ax_pos.set_xlabel("time (s)")
    ax_pos.set_xlim(t0, t1)
    commit = ("eager: a finished chunk is locked at once (solid)" if data.eager else
              "lazy: cached future stays replaceable (faded) until it plays")
    ax_pos.set_title(f"prediction cache: line = cached from ready until played (block) or "
                     f"discarded (dotted, x); {commit}; staircase = playhead", fontsize=8)
    drawn_jobs = jobs[(jobs["kind"] != "prebuffer") & (jobs["t_ready"] >= t0)
                      & (jobs["t_start"] <= t1)]
    versions = sorted({int(v) for v in drawn_jobs["version"]}
                      | {int(v) for v in visible["version"]})  # those the window draws
    handles = [Patch(color=_version_color(v), label=f"V{v}") for v in versions[:10]]
    if len(versions) > 10:
        handles.append(Patch(color="white", label=f"(+{len(versions) - 10} more)"))
    handles += [Patch(facecolor="white", hatch="////", edgecolor="black", label="discarded"),
                Patch(color="#d62728", alpha=0.15, label="stall")]
    ax_pos.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    return fig
