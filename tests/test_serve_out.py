"""Both ends of a ``latsim serve`` session in one run-folder schema: ``serve --out`` writes a
server-side folder per session and the shared device's tasks; ``export perfetto`` of a
client folder with its server folder shows both sides on one timeline (the structural
checks of ``tests/test_perfetto.py`` plus the offset metadata); ``plot timeline`` draws a
client folder; format 1 client folders are still read, and migrate to what format 2 is
(the ``sleep`` generator on loopback)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import threading
from pathlib import Path

import pytest

pytest.importorskip("websockets")

from typer.testing import CliRunner

from harness.serve.config import ServerConfig
from harness.serve.server import DEVICE_TASKS, ServerThread, StreamServer
from harness.viewer.client import ClientConfig, run_client
from latsim.cli.root import app
from latsim.errors import LatsimError
from latsim.model.traces import Trace
from latsim.plugins import GeneratorConfig
from latsim.run.folder import SERVED, read_run_folder
from latsim.run.record_files import read_csv
from latsim.run.serving import TaskRecord
from latsim.run.viewer import FORMAT1_NAMES, migrate_client_folder, read_viewer_records
from latsim.viz.perfetto import client_trace, perfetto_trace
from tests.test_perfetto import check_trace

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, Path, StreamServer]:
    """Two viewers at once on one server with --out: (serve folder, client folders' root,
    the server)."""
    root = tmp_path_factory.mktemp("serve")
    out, clients = root / "serve", root / "clients"
    built = StreamServer(ServerConfig(GeneratorConfig(cost="fixed:0.05"),
                                      generator_name="sleep", Ks=(4,), port=0, warmup=2,
                                      out=out))
    built.prepare()
    with ServerThread(built) as port:
        def viewer(name: str, policy: str, times: tuple[float, ...]) -> None:
            run_client(ClientConfig(f"ws://127.0.0.1:{port}", Trace(name, times, 3.0),
                                    clients / name, policy=policy, drain=0.5, seed=len(name)))

        threads = [threading.Thread(target=viewer, args=("a", "speculative", (0.4, 1.3, 2.2))),
                   threading.Thread(target=viewer, args=("bb", "baseline", (0.7, 1.9)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    return out, clients, built


def test_serve_out_writes_a_folder_per_session_and_the_device_tasks(served):
    out, clients, built = served
    sessions = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(sessions) == 2
    client_sessions = {read_run_folder(clients / n).config["session"] for n in ("a", "bb")}
    assert {p.name for p in sessions} == client_sessions  # a session's folder is its id
    tasks = list(read_csv(out / DEVICE_TASKS, TaskRecord))
    for path in sessions:
        folder = read_run_folder(path)
        config = folder.config
        assert folder.kind == SERVED and folder.state == "complete", config
        assert config["server_run"] == built.run_id and config["session"] == path.name
        assert isinstance(config["server_start"], float) and config["end_time"] >= 3.0
        assert folder.summary["session"] == path.name and folder.summary["n_conditions"] >= 2
        jobs = [job for _, job in folder.records("jobs") if job.kind != "prebuffer"]
        mine = sorted(task.job_id for extra, task in tasks if extra["session"] == path.name)
        assert mine == sorted(job.job_id for job in jobs)  # every job the device ran for it
        assert len(folder.trace().times) == len(list(folder.records("conditions")))
    assert all(extra["server_run"] == built.run_id for extra, _ in tasks)
    ordered = sorted((task for _, task in tasks), key=lambda t: t.t_start)
    for task in ordered:
        assert task.t_enqueue <= task.t_start < task.t_end
    for a, b in zip(ordered, ordered[1:], strict=False):  # one device: one task at a time
        assert b.t_start >= a.t_end - 1e-6
    # the server's folders are its own: compare says so instead of predicting them alone
    result = runner.invoke(app, ["compare", str(out), "--format", "json"])
    assert result.exit_code == 2 and "served" in result.stderr


def test_a_sessions_summary_json_and_its_end_message_agree(served):
    """The server's summary.json and the ``end`` message the client keeps as
    ``server_summary`` are one summary of the same covered window: every metric they share
    is equal (the served folder adds the run's identity and status)."""
    out, clients, _ = served
    for name in ("a", "bb"):
        client = read_run_folder(clients / name)
        sent = client.summary["server_summary"]
        written = read_run_folder(out / client.config["session"]).summary
        shared = set(sent) & set(written)
        assert {"L_mean", "L50", "L95", "L99", "stall_pct", "n_conditions",
                "L_basis"} <= shared
        assert {key: written[key] for key in shared} == {key: sent[key] for key in shared}


def test_perfetto_shows_both_sides_of_a_session_with_the_offset(served, tmp_path):
    out, clients, _ = served
    client = clients / "a"
    config = read_run_folder(client).config
    trace_file = tmp_path / "both.json"
    result = runner.invoke(app, ["export", "perfetto", str(client), "--server", str(out),
                                 "--out", str(trace_file)])
    assert result.exit_code == 0, result.stderr
    trace = json.loads(trace_file.read_text())
    check_trace(trace)
    meta = trace["metadata"]
    assert meta["kind"] == "client" and meta["session"] == config["session"]
    assert meta["offset"] == config["offset"]
    assert meta["offset_uncertainty"] == config["offset_uncertainty"] > 0
    assert meta["server_folder"] == str(out / config["session"])
    assert {"offset_final", "offset_final_uncertainty", "drift", "rtt_min"} <= set(meta)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"generator", "shared device (every session)", "playback", "display",
            "client stalls", "conditions"} <= names
    assert any(n.startswith("viewer: session") and "client clock" in n for n in names)
    device = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "device"]
    assert {e["args"]["session"] for e in device} == {p.name for p in out.iterdir()
                                                      if p.is_dir()}
    # arrows from each send to the server's arrival, from each slot's play to its display
    flows = {e["name"] for e in trace["traceEvents"] if e["ph"] == "s"}
    assert {"sent", "displayed", "shown"} <= flows
    # the session folder itself works too, and alone the client folder shows the server
    # as the client was told it
    same = client_trace(client, out / config["session"])
    assert same["traceEvents"] == trace["traceEvents"]
    told = perfetto_trace(client)
    check_trace(told)
    assert told["metadata"]["server_folder"] is None
    other = read_run_folder(clients / "bb").config["session"]
    with pytest.raises(LatsimError, match="not the client's"):
        client_trace(client, out / other)


def test_plot_timeline_draws_a_client_folder_and_a_served_one(served, tmp_path):
    out, clients, _ = served
    for source, name in ((clients / "a", "client.png"), (clients / "bb", "base.png"),
                         (next(p for p in out.iterdir() if p.is_dir()), "served.png")):
        result = runner.invoke(app, ["plot", "timeline", str(source), "--out",
                                     str(tmp_path / name)])
        assert result.exit_code == 0, result.stderr
        assert (tmp_path / name).stat().st_size > 10_000
    result = runner.invoke(app, ["plot", "timeline", str(clients / "a"), "--K", "8"])
    assert result.exit_code == 2 and "names none" in result.stderr


def _as_format1(folder: Path) -> None:
    """Rewrite a format 2 client folder as format 1 wrote it (viewer.csv, the old names,
    no leading columns)."""
    old = {"conditions": ["cid", "version", "sent", "arrival", "start", "ready", "played",
                          "received", "shown", "displayed", "L", "L_server", "status"]}
    for table, renames in FORMAT1_NAMES.items():
        back = {new: name for name, new in renames.items()}
        rows = list(csv.DictReader(io.StringIO((folder / f"{table}.csv").read_text())))
        header = old.get(table) or [back.get(k, k) for k in rows[0]
                                    if k not in ("policy", "K", "run")]
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(header)
        for row in rows:
            renamed = {**row, **{back[k]: v for k, v in row.items() if k in back}}
            writer.writerow([renamed[name] for name in header])
        (folder / f"{table}.csv").unlink()
        name = "viewer" if table == "conditions" else table
        (folder / f"{name}.csv").write_text(text.getvalue(), newline="")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 1}))


def test_a_format1_client_folder_reads_the_same_and_migrates_to_format2(tmp_path):
    committed = ROOT / "results" / "serve" / "runs" / "v1-speculative"
    folder = tmp_path / "old"
    shutil.copytree(committed, folder)
    _as_format1(folder)
    assert (folder / "viewer.csv").exists() and not (folder / "conditions.csv").exists()
    assert read_viewer_records(folder) == read_viewer_records(committed)
    assert migrate_client_folder(folder) and not migrate_client_folder(folder)
    for table in ("conditions", "slots", "stalls", "jobs", "probes"):
        assert ((folder / f"{table}.csv").read_bytes()
                == (committed / f"{table}.csv").read_bytes()), table
    assert not (folder / "viewer.csv").exists()
    assert read_run_folder(folder).config["format_version"] == 2
