"""The timeline figure (like the paper's Figures 1–2), drawn only from a run folder's CSVs.

A run folder (:mod:`latsim.run.folder`: an experiment, a simulated or a measured run) holds
``jobs.csv``, ``slots.csv``, ``discards.csv``, ``conditions.csv`` and ``stalls.csv`` with
``policy, K, run`` columns first. Nothing here touches the simulator, so the figure works
unchanged on measured runs. pandas and matplotlib are imported inside the functions.

A partial run (:attr:`latsim.run.folder.RunFolder.state` other than ``complete``: interrupted,
failed, or left ``incomplete`` by a killed writer) says so in the figure's title, with the time
its records end (the ``end_time`` it stated, else its last finished job), which is marked on
the time axis; a torn last CSV row, dropped on reading, is noted there too.

A serving folder (several streams on shared devices: a ``stream`` column, ``tasks.csv`` and
``starts.csv``) is drawn one stream at a time, on that stream's clock. Its generator row
also shows the other streams' tasks on the devices this stream uses (a light grey band,
"other streams") and each of this stream's waits for a device (a dashed box), so that a
wait for the device shows what it waited for. Colours and sizes come from
:mod:`latsim.viz.style`.

A client folder (:mod:`latsim.run.viewer`, the viewer's side of a ``latsim serve`` session)
is drawn with both clocks on one stream-time axis: the server's jobs and playback as the
client converted them (server times minus the server's playback start: no offset), a lane of
what the viewer displayed on its own clock (each slot from its display time; late slots, the
client stalls, boxed in red), and each condition from its send to its display: uplink, R, C,
Q, then delivery and playout ("to screen"), with L the end-to-end latency. The title gives
the clock offset the client times carry and its bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from latsim.errors import LatsimError
from latsim.run.folder import COMPLETE, RunFolder, read_run_folder
from latsim.run.viewer import KIND as CLIENT_KIND
from latsim.viz.style import FONT, TIMELINE_COLORS, version_color

RECORD_FILES = ("jobs", "slots", "discards", "conditions", "stalls")
REQUIRED = ("jobs", "slots")


@dataclass(frozen=True)
class ClientView:
    """What a client folder adds to its run: the viewer's own clock."""

    slots: Any  # DataFrame: position, version, t_shown, t_displayed (client clock)
    stalls: Any  # DataFrame: the client stalls (a late slot), t_start, t_end
    offset: float | None  # server minus client, the estimate the client times use
    offset_uncertainty: float | None  # its bound, RTT_min / 2
    session: str | None


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
    #: a serving folder: the other streams' tasks on the devices this stream uses, and
    #: this stream's waits for a device, as ``(start, end)`` on this stream's clock
    other_streams: tuple[tuple[float, float], ...] = ()
    waits: tuple[tuple[float, float], ...] = ()
    shared_devices: tuple[str, ...] = ()  # those devices, "pool device"
    client: ClientView | None = None  # a client folder: the viewer's clock

    @property
    def T(self) -> float:  # the paper's symbol
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


def _select(frame, policy: str | None, K: int | None, run: int | None,
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


def select_run(run_dir: str | Path, policy: str | None = None, K: int | None = None,
               run: int | None = None, stream: int | None = None) -> RunData:
    """Read a run folder (:mod:`latsim.run.folder`) and select one (policy, K, run) and, in
    a serving folder (records with a ``stream`` column), one stream; ``None`` picks the
    first present."""
    folder = read_run_folder(run_dir)
    if folder.kind == CLIENT_KIND:
        return _client_run(folder, policy, K, run, stream)
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
        K = int(sel.iloc[0]["K"]) if "K" in sel.columns else int(sel["length"].max())
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
    others, waits, devices = (), (), ()
    if stream is not None:
        others, waits, devices, torn = _device_use(folder, policy, int(K), int(run), stream)
        notes += torn
    return RunData(policy, int(K), int(run), delta, eager, picked["jobs"], picked["slots"],
                   picked["discards"], picked["conditions"], picked["stalls"], status,
                   end_time, duration, notes, stream, others, waits, devices)


def _device_use(folder: RunFolder, policy: str, K: int, run: int,
                stream: int) -> tuple[tuple, tuple, tuple, tuple[str, ...]]:
    """From a serving folder's ``tasks.csv``: the other streams' tasks on the devices
    ``stream`` uses, this stream's waits for a device (enqueued until started), and those
    devices; all on the stream's clock (its records start at its ``t_origin`` of
    ``starts.csv``); and the notes of torn last rows dropped from the two. Empty where the
    folder kept no tasks."""
    if not (folder.path / "tasks.csv").exists() or folder.config.get(
            "records", "all") != "all":  # no tasks, or counted, not kept (--records)
        return (), (), (), ()
    frame = folder.frame("tasks")
    notes = (frame.attrs["torn"],) if frame.attrs.get("torn") else ()
    tasks = _select(frame, policy, K, run)
    if tasks.empty or "stream" not in tasks.columns:
        return (), (), (), notes
    origin = 0.0
    if (folder.path / "starts.csv").exists():
        frame = folder.frame("starts")
        notes += (frame.attrs["torn"],) if frame.attrs.get("torn") else ()
        starts = _select(frame, policy, K, run, stream)
        if not starts.empty:
            origin = float(starts.iloc[0]["t_origin"])
    device = tasks["pool"].astype(str) + " " + tasks["device"].astype(int).astype(str)
    mine = tasks["stream"] == stream
    own = tasks[mine]
    devices = sorted(set(device[mine]))
    others = tasks[~mine & device.isin(devices)]
    spans = tuple(sorted((float(a) - origin, float(b) - origin)
                         for a, b in zip(others["t_start"], others["t_end"], strict=True)))
    waits = tuple(sorted((float(a) - origin, float(b) - origin)
                         for a, b in zip(own["t_enqueue"], own["t_start"], strict=True)
                         if b - a > 1e-9))
    return spans, waits, tuple(devices), notes


def _client_run(folder: RunFolder, policy: str | None, K: int | None,
                run: int | None, stream: int | None) -> RunData:
    """A client folder as :class:`RunData`: the server's side as the client converted it,
    the viewer's clock in :attr:`RunData.client`."""
    import pandas as pd

    from latsim.run.viewer import ViewerCondition, read_viewer_records

    config = folder.config
    have_policy, have_k = str(config.get("policy", "")), config.get("K")
    if stream is not None:
        raise LatsimError(f"{folder.path}: a client folder has one stream; drop --stream")
    for option, asked, have in (("--policy", policy, have_policy), ("--K", K, have_k),
                                ("--run", run, 0)):
        if asked is not None and asked != have:
            raise LatsimError(f"{folder.path}: a client run of {have_policy} K={have_k} "
                              f"(run 0); {option} {asked} names none")
    if not isinstance(have_k, int) or not config.get("r") or not config.get("fps"):
        raise LatsimError(f"{folder.path}/config.json: no session (K, r, fps): nothing to draw")
    records = read_viewer_records(folder.path)
    if not records.jobs or not records.slots:
        raise LatsimError(f"{folder.path}: no jobs or slots recorded: nothing to draw")

    def frame(rows: tuple, columns: list[str]) -> Any:
        return pd.DataFrame([{c: getattr(r, c) for c in columns} for r in rows],
                            columns=columns)

    jobs = frame(records.jobs, ["job_id", "kind", "branch", "length", "version", "t_start",
                                "t_ready"])
    slots = frame(records.slots, ["position", "version", "job_id", "t_start"])
    conditions = frame(records.conditions, [f.name for f in fields(ViewerCondition)])
    server = [s for s in records.stalls if s.side == "server"]
    client = [s for s in records.stalls if s.side == "client"]
    view = ClientView(frame(records.slots, ["position", "version", "t_shown", "t_displayed"]),
                      frame(tuple(client), ["t_start", "t_end"]),
                      config.get("offset"), config.get("offset_uncertainty"),
                      config.get("session"))
    status = folder.state
    end_time = None
    if status != COMPLETE:
        end_time = folder.end_time
        if end_time is None:
            end_time = max([0.0] + [s.t_received for s in records.slots]
                           + [c.t_sent for c in records.conditions])
    duration = folder.duration if "duration" in config else None
    delta = float(config["r"]) / float(config["fps"])
    return RunData(have_policy, have_k, 0, delta, config.get("policy") == "baseline", jobs,
                   slots, pd.DataFrame(), conditions,
                   frame(tuple(server), ["position", "t_start", "t_end"]), status, end_time,
                   duration, records.notes, client=view)


def _span(cond: Any, client: bool) -> tuple[float, float]:
    """A condition's drawn span: arrival to play, or for a client run send to display."""
    if client:
        return float(cond.t_sent), float(cond.t_displayed)
    return float(cond.t_arrival), float(cond.t_play)


def default_window(data: RunData) -> tuple[float, float]:
    """Around the first shown condition (1.5 T either side), else the first 4 T."""
    conds = data.conditions
    if not conds.empty and "displayed" in conds.columns:
        shown = conds[conds["displayed"].astype(str) == "True"]
        if not shown.empty:
            first, last = _span(shown.iloc[0], data.client is not None)
            return max(0.0, first - 1.5 * data.T), last + 1.5 * data.T
    return 0.0, 4 * data.T


def _version_color(version: int):  # a matplotlib colour
    return version_color(version)


def condition_lanes(spans: list[tuple[float, float]], most: int = 3) -> list[int]:
    """A lane per condition ``(start, end)`` span (arrival to the end of its label), the
    first lane free at its start, so that conditions whose spans overlap are drawn on
    different lanes; at most ``most`` lanes, reused in turn beyond that."""
    ends: list[float] = []
    lanes = []
    for start, end in spans:
        lane = next((i for i, last in enumerate(ends) if last <= start), None)
        if lane is None:
            if len(ends) < most:
                lane = len(ends)
                ends.append(end)
            else:
                lane = min(range(most), key=lambda i: ends[i])
        ends[lane] = max(ends[lane], end)
        lanes.append(lane)
    return lanes


def plot_timeline(data: RunData, out: str | Path, t0: float | None = None,
                  t1: float | None = None) -> Path:
    """Draw the timeline of ``data`` between ``t0`` and ``t1`` into the PNG ``out``."""
    from latsim.viz import style

    path = Path(out)
    if path.is_dir():
        path = path / "timeline.png"
    elif path.suffix.lower() != ".png":  # matplotlib would add .png and we would say out
        raise LatsimError(f"--out {out}: give a .png path or an existing folder")
    fig = timeline_figure(data, t0, t1)
    path.parent.mkdir(parents=True, exist_ok=True)
    return style.save(fig, path)


def timeline_figure(data: RunData, t0: float | None = None, t1: float | None = None):
    """The figure of :func:`plot_timeline` (the caller closes it)."""
    from matplotlib.patches import Patch

    from latsim.viz import style

    plt = style.pyplot()

    lo, hi = default_window(data)
    t0 = lo if t0 is None else t0
    t1 = hi if t1 is None else t1
    if not (math.isfinite(t0) and math.isfinite(t1)):
        raise LatsimError(f"the window needs finite times, got t0={t0:g}, t1={t1:g}")
    if not t1 > t0:
        raise LatsimError(f"the window needs t1 > t0, got t0={t0:g}, t1={t1:g}")
    delta, K = data.delta, data.K
    jobs = data.jobs
    slots = data.slots
    discards = data.discards
    conds = data.conditions
    fig, (ax_time, ax_pos) = plt.subplots(
        2, 1, figsize=style.TIMELINE, sharex=True, gridspec_kw={"height_ratios": [1.1, 1.6]}
    )

    # --- lanes over time: generator, playback, (a client's display,) conditions
    client = data.client
    y_gen, y_play, y_cond = (3.0, 2.0, 0.0) if client is not None else (2.0, 1.0, 0.0)
    y_view = 1.0  # a client run's: what the viewer displayed, on its clock
    discarded_by_job: dict[int, int] = {}
    if not discards.empty:
        for job_id, count in discards.groupby("job_id")["count"].sum().items():
            discarded_by_job[int(job_id)] = int(count)
    other_color = TIMELINE_COLORS["other_streams"]
    others = [(a, b - a) for a, b in data.other_streams if b >= t0 and a <= t1]
    if others:  # behind this stream's jobs: what a wait for the device waited for
        ax_time.broken_barh(others, (y_gen - 0.35, 0.7), facecolors=other_color,
                            edgecolor="none", zorder=0)
        for a, width in others:
            if width > 0.06 * (t1 - t0):
                ax_time.text(a + width / 2, y_gen, "other\nstreams", ha="center",
                             va="center", fontsize=FONT["tiny"],
                             color=TIMELINE_COLORS["other_streams_text"], clip_on=True,
                             zorder=1)
    waits = [(a, b - a) for a, b in data.waits if b >= t0 and a <= t1]
    if waits:
        ax_time.broken_barh(waits, (y_gen - 0.35, 0.7), facecolors="none",
                            edgecolor="black", linewidth=0.9, linestyle="--", zorder=3)
        for a, width in waits:
            if width > 0.05 * (t1 - t0):
                ax_time.text(a + width / 2, y_gen - 0.5, f"wait {width:.2f}", ha="center",
                             va="center", fontsize=FONT["tiny"], clip_on=True)
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
        # on a white ground above the conditions' dashed lines (a replan's label sits on
        # the arrival that started it)
        ax_time.text(job.t_start + width / 2, y_gen + (0.5 if narrow else 0.0),
                     f"{job.kind} v{int(job.version)}", ha="center", va="center",
                     fontsize=FONT["tiny"] if narrow else FONT["note"], clip_on=True,
                     zorder=3, bbox={"facecolor": "white", "edgecolor": "none",
                                     "pad": 0.4} if narrow else None)
    visible = slots[(slots["t_start"] + delta >= t0) & (slots["t_start"] <= t1)]
    for version, group in visible.groupby("version"):
        ax_time.broken_barh([(t, delta) for t in group["t_start"]], (y_play - 0.35, 0.7),
                            facecolors=_version_color(int(version)), edgecolor="white",
                            linewidth=0.3)
    if not data.stalls.empty:
        for stall in data.stalls.itertuples():
            for ax in (ax_time, ax_pos):
                ax.axvspan(stall.t_start, stall.t_end, color=TIMELINE_COLORS["stall"],
                           alpha=0.15, lw=0)
    if client is not None:  # each slot from the time the viewer displayed it
        view = client.slots
        start = view["t_displayed"].where(view["t_displayed"].notna(), view["t_shown"])
        view = view.assign(at=start)
        view = view[(view["at"] + delta >= t0) & (view["at"] <= t1)]
        for version, group in view.groupby("version"):
            ax_time.broken_barh([(t, delta) for t in group["at"]], (y_view - 0.35, 0.7),
                                facecolors=_version_color(int(version)), edgecolor="white",
                                linewidth=0.3)
        late = [(a, b - a) for a, b in zip(client.stalls["t_start"], client.stalls["t_end"],
                                            strict=True) if b >= t0 and a <= t1]
        if late:
            ax_time.broken_barh(late, (y_view - 0.42, 0.84), facecolors="none",
                                edgecolor=TIMELINE_COLORS["stall"], linewidth=1.2, zorder=3)

    shown = conds
    if not conds.empty and "displayed" in conds.columns:
        shown = conds[conds["displayed"].astype(str) == "True"]
    in_client = client is not None
    in_window = [cond for cond in (shown.itertuples() if not shown.empty else [])
                 if not (_span(cond, in_client)[1] < t0 or _span(cond, in_client)[0] > t1)]
    label_width = 0.15 * (t1 - t0)  # "v3 shown, L=1.23 s" to the right of its marker
    # seconds of the time axis one character of the tiny font takes (labels of narrow bars
    # are set below them in rows, so that neighbours do not print over each other)
    axis_inches = ax_time.get_position().width * ax_time.figure.get_figwidth()
    char_s = 0.6 * FONT["tiny"] / 72 * (t1 - t0) / axis_inches
    lanes = condition_lanes([(_span(c, in_client)[0], _span(c, in_client)[1] + label_width)
                             for c in in_window])
    n_lanes = max(lanes, default=0) + 1
    lane_height = 0.9 / n_lanes
    for cond, lane in zip(in_window, lanes, strict=True):
        y = y_cond + 0.45 - lane_height * (lane + 0.5)
        bar = 0.55 * lane_height
        superseded = str(cond.superseded) == "True"
        begin, shown_at = _span(cond, in_client)
        for ax in (ax_time, ax_pos):
            ax.axvline(begin, color=_version_color(int(cond.version)), ls="--", lw=0.9)
        segments = (("R", cond.t_arrival, cond.t_start),
                    ("C", cond.t_start, cond.t_ready),
                    ("Q", cond.t_ready, cond.t_play))
        if in_client:  # on the client's clock before and after: the offset's error is there
            segments = (("uplink", cond.t_sent, cond.t_arrival), *segments,
                        ("to screen", cond.t_play, cond.t_displayed))
        row_ends: list[float] = []  # per row below the bar: where its last label ends
        for label, a, b in segments:
            if b - a > 1e-9:
                color = TIMELINE_COLORS[label.replace(" ", "_")]
                ax_time.broken_barh([(a, b - a)], (y - bar / 2, bar), facecolors=color,
                                    alpha=0.6 if superseded else 0.9)
                text = f"{label} {b - a:.2f}"
                if b - a > 1.2 * len(text) * char_s * FONT["note"] / FONT["tiny"]:
                    ax_time.text((a + b) / 2, y, text, ha="center", va="center",
                                 fontsize=FONT["note"], color="white", clip_on=True)
                else:  # too narrow for its label (in its own font): below the bar, in its
                    # colour, in the first row where it clears its neighbour
                    half = len(text) * char_s / 2
                    row = next((i for i, end in enumerate(row_ends)
                                if end < (a + b) / 2 - half), len(row_ends))
                    if row == len(row_ends):
                        row_ends.append(0.0)
                    row_ends[row] = (a + b) / 2 + half
                    ax_time.text((a + b) / 2, y - bar / 2 - 0.02 - 0.07 * row, text,
                                 ha="center", va="top", fontsize=FONT["tiny"], color=color,
                                 clip_on=True)
        ax_time.plot([shown_at], [y], marker="v", color="black", ms=6 if n_lanes == 1
                     else 4)
        near_end = shown_at + label_width > t1  # set it left of its marker, not cut off
        ax_time.text(shown_at, y + bar / 2 + 0.03,
                     f"v{int(cond.version)} shown, L={cond.L:.2f} s"
                     + (" (superseded)" if superseded else ""), fontsize=FONT["note"],
                     va="bottom", ha="right" if near_end else "left", clip_on=True)
    if client is not None:
        ax_time.set_yticks([y_cond, y_view, y_play, y_gen],
                           ["conditions\n(send to display)", "viewer display\n(client clock)",
                            "server playback\n(server clock)", "generator\njobs (server)"])
    else:
        ax_time.set_yticks([y_cond, y_play, y_gen], ["conditions\n(R, C, Q)", "playback",
                                                     "generator\njobs"])
    ax_time.set_ylim(-0.6, y_gen + 0.6)
    status = data.status_line()
    of_run = "" if data.duration is None else f" of a {data.duration:g} s run"
    where = f"run {data.run}" + ("" if data.stream is None else f", stream {data.stream}")
    device_keys = []  # what the window draws of the shared device, said once
    if others:
        device_keys.append("light grey = other streams' tasks on "
                           + ", ".join(data.shared_devices))
    if waits:
        device_keys.append("dashed box = this stream waiting for a device")
    shared = ";\n" + ", ".join(device_keys) if device_keys else ""
    if client is not None:
        offset = ("unknown" if client.offset is None else f"{1e3 * client.offset:+.2f} ms"
                  + ("" if client.offset_uncertainty is None
                     else f" ± {1e3 * client.offset_uncertainty:.2f} ms"))
        where += f", client session {client.session}" if client.session else ", client run"
        shared += (f";\nclient times (send, display) are the client's clock, offset {offset} "
                   "(server − client, bound RTT_min/2); red box = client stall; "
                   "L = send to display")
    ax_time.set_title(f"{data.policy}: K={K}, δ={delta:.3f} s, T={data.T:.2f} s, {where}; "
                      f"shown: {t0:.2f}–{t1:.2f} s{of_run}\n(colour = condition version, grey = "
                      f"V0; hatched = discarded part; red = stall{shared})"
                      + (f"\n{status}" if status else ""),
                      fontsize=FONT["title"],
                      color=TIMELINE_COLORS["partial"] if data.partial else "black")
    ax_time.tick_params(labelbottom=True)  # its own time axis, not only the lower panel's
    if data.partial and data.end_time is not None and data.end_time < t1:
        for ax in (ax_time, ax_pos):
            ax.axvspan(max(t0, data.end_time), t1, color=TIMELINE_COLORS["unrecorded"],
                       alpha=0.12, lw=0)
            ax.axvline(data.end_time, color=TIMELINE_COLORS["partial"], lw=1.2)
        ax_time.text(data.end_time, y_gen + 0.45, f" records end ({data.status})",
                     fontsize=FONT["legend"], color=TIMELINE_COLORS["partial"], va="center",
                     clip_on=True)

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
        ax_pos.text(cond.t_arrival, (head + branch) / 2, " locked prefix",
                    fontsize=FONT["note"], va="center")
        ax_pos.text(cond.t_arrival, branch + K / 2, " replaceable future → branch "
                    f"{branch}", fontsize=FONT["note"], va="center")
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
                     f"discarded (dotted, x); {commit}; staircase = playhead",
                     fontsize=FONT["suptitle_small"])
    drawn_jobs = jobs[(jobs["kind"] != "prebuffer") & (jobs["t_ready"] >= t0)
                      & (jobs["t_start"] <= t1)]
    versions = sorted({int(v) for v in drawn_jobs["version"]}
                      | {int(v) for v in visible["version"]})  # those the window draws
    handles = [Patch(color=_version_color(v), label=f"V{v}") for v in versions[:10]]
    if len(versions) > 10:
        handles.append(Patch(color="white", label=f"(+{len(versions) - 10} more)"))
    handles += [Patch(facecolor="white", hatch="////", edgecolor="black", label="discarded"),
                Patch(color=TIMELINE_COLORS["stall"], alpha=0.15, label="stall")]
    if others:
        handles.append(Patch(facecolor=other_color, edgecolor="none",
                             label="other streams on the shared device"))
    if waits:
        handles.append(Patch(facecolor="none", edgecolor="black", linestyle="--",
                             label="waiting for the device"))
    ax_pos.legend(handles=handles, fontsize=FONT["legend"], loc="upper left", ncol=2)
    fig.tight_layout()
    return fig
