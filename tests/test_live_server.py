"""latsim serve / latsim client on loopback (tiny preset, CPU), in process: the wire format,
the playout rule, the shared device's schedule, and the fault cases (malformed messages, a
condition for another session, a viewer that disconnects, a server that stops)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("websockets")

from harness.net.netclock import Shaper
from harness.net.wire import ProtocolError, decode_frame, encode_frame, parse_text
from harness.serve.config import ServerConfig
from harness.serve.device import SharedDevice
from harness.serve.server import ServerThread, StreamServer
from harness.viewer.client import ClientConfig, run_client
from latsim.cli import app
from latsim.controller import StartJob
from latsim.controller.playout import ClientPlayout
from latsim.errors import LatsimError
from latsim.model.traces import Trace
from latsim.plugins import GeneratorConfig, JobTiming
from latsim.run.folder import read_run_folder
from latsim.run.viewer import read_viewer_records
from latsim.viz.perfetto import perfetto_trace
from tests.helpers import envelope_of
from tests.test_perfetto import check_trace

OFFSET = 250.0  # the server's clock runs this far ahead of the client's


# ---------------------------------------------------------------- pure parts


def test_frame_round_trip_and_malformed_frames():
    header = {"type": "slot", "position": 3, "resolves": [{"version": 1}]}
    data = encode_frame(header, b"\x00\x01payload")
    assert decode_frame(data) == (header, b"\x00\x01payload")
    for bad in (b"", b"XXXX\x00\x00\x00\x01{", data[:10], b"LSF1\x00\x00\x00\x02[]"):
        with pytest.raises(ProtocolError):
            decode_frame(bad)
    for bad in ("", "[]", '{"t0": 1}', '{"type": 3}', "x" * 70000, b"{}"):
        with pytest.raises(ProtocolError):
            parse_text(bad)


@given(st.floats(0, 2), st.lists(st.tuples(st.floats(0.01, 1), st.floats(0, 3)),
                                 min_size=1, max_size=40))
def test_playout_rule_never_shows_early_and_keeps_slot_spacing(delay, steps):
    """Slots shown in order, never before server time + D or before they arrive; a slot
    is late (a client stall) exactly when it arrives after its due time; once shifted, the
    client never shows a slot sooner after its predecessor than the server played it."""
    playout = ClientPlayout(delay)
    played, previous = 0.0, None
    for gap, network in steps:
        played += gap
        arrives = played + network
        placed = playout.show(played, arrives)
        assert placed.shown >= played + delay - 1e-9
        assert placed.shown >= arrives - 1e-9
        assert placed.stalled == (arrives > placed.due + 1e-9)
        if previous is not None:
            assert placed.shown - previous[1] >= played - previous[0] - 1e-9
        previous = (played, placed.shown)


class _FakeGenerator:
    """Runs nothing: records the order the device took jobs in."""

    def __init__(self, hold: threading.Event) -> None:
        self.order: list[int] = []
        self.hold = hold

    def run_job(self, job, decode_group=1, stream=None) -> JobTiming:
        self.hold.wait(5)
        self.order.append(job.job_id)
        now = time.perf_counter()
        return JobTiming(job.job_id, job.kind, job.length, job.branch, job.version, 0, now,
                         now, None, 0, 0)

    def payload(self, stream, position):
        return "latent", (1,), b"\x00"


class _Stub:
    stream = None
    streams = itertools.count()

    def __init__(self) -> None:
        from harness.live.faults import JobFaults

        self.index = next(self.streams)  # a session of its own
        self.payloads: dict = {}
        self.faults = JobFaults("stub", ())


@pytest.mark.parametrize("schedule, expected", [
    ("fifo", [1, 2, 3, 4]),
    ("replan-first", [1, 3, 2, 4]),
    ("least-slack", [1, 4, 2, 3]),
])
def test_shared_device_serves_waiting_jobs_in_schedule_order(schedule, expected):
    """Job 1 occupies the device while 2, 3, 4 queue; the device then takes them in the
    serving model's order, and tells each waiting job's stream when it started."""
    hold = threading.Event()
    generator = _FakeGenerator(hold)
    device = SharedDevice(generator, schedule)
    started: dict[int, float] = {}
    jobs = [(1, "refill", 5.0), (2, "refill", 3.0), (3, "replan", 9.0), (4, "refill", 1.0)]
    threads = []
    for job_id, kind, playable in jobs:
        job = StartJob(job_id, kind, 4 * job_id, 4, 1, 4 * job_id)
        thread = threading.Thread(target=device.run, args=(
            _Stub(), job, playable, lambda t, j=job_id: started.__setitem__(j, t)))
        thread.start()
        threads.append(thread)
        time.sleep(0.05)  # 1 is taken first; the others wait behind it
    hold.set()
    for thread in threads:
        thread.join(5)
    device.stop()
    assert generator.order == expected
    assert set(started) == {2, 3, 4}  # only the jobs that waited report a start


# ---------------------------------------------------------------- on loopback


@pytest.fixture(scope="module")
def server():
    built = StreamServer(ServerConfig(GeneratorConfig("tiny", "tiny", 2), Ks=(4,), port=0,
                                      warmup=3, clock_offset=OFFSET))
    built.prepare()
    with ServerThread(built):
        yield built


def _client(server, out: Path, times=(0.8, 2.1, 3.3), duration=4.0, **kwargs) -> dict:
    trace = Trace("test", tuple(times), duration)
    return run_client(ClientConfig(f"ws://127.0.0.1:{server.port}", trace, out, K=4,
                                   **kwargs))


def test_client_session_measures_and_aligns_its_clock(server, tmp_path):
    summary = _client(server, tmp_path / "run", uplink=Shaper(0.01, 0.002))
    assert summary["status"] == "complete"
    # the min-RTT estimate of a 250 s offset, within its own bound
    assert abs(summary["offset"] - OFFSET) <= summary["offset_uncertainty"] + 1e-6
    assert summary["offset_uncertainty"] >= 0.008  # both directions were shaped (>= 8 ms each)
    folder = read_run_folder(tmp_path / "run")
    assert folder.config["kind"] == "client" and folder.config["status"] == "complete"
    records = read_viewer_records(tmp_path / "run")
    assert [c.status for c in records.conditions] == ["shown"] * 3
    for c in records.conditions:
        assert (c.t_sent < c.t_arrival <= c.t_start < c.t_ready <= c.t_play < c.t_received
                <= c.t_displayed)
        assert c.L == pytest.approx(c.t_displayed - c.t_sent)
        assert c.t_arrival - c.t_sent > 0.008 - summary["offset_uncertainty"]
    positions = [s.position for s in records.slots]
    assert positions == sorted(positions) and len(positions) >= 15
    assert all(s.bytes > 0 and s.payload == "latent" for s in records.slots)
    assert summary["n_jobs"] == len(records.jobs) - 1 > 0  # the prebuffer ran on no device
    # the Perfetto export shows it: the server's side as told, and the viewer's clock
    trace = perfetto_trace(tmp_path / "run")
    check_trace(trace)
    assert trace["metadata"]["offset"] == summary["offset"]
    # latsim compare takes the client run to the viewer-side table and its files
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "run"), "--out",
                                      str(tmp_path / "cmp"), "--replications", "3"])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "cmp" / "compare_viewer.json").read_text())["rows"][0]
    assert row["run"] == "run" and row["predicted_with"] == 1
    assert row["L50_measured"] == pytest.approx(summary["L50"])
    assert (tmp_path / "cmp" / "compare_viewer_cdf.png").stat().st_size > 0


def test_malformed_and_foreign_messages_get_errors_and_the_server_keeps_serving(server,
                                                                              tmp_path):
    from websockets.asyncio.client import connect

    async def probe_errors() -> list[str]:
        errors = []
        async with connect(f"ws://127.0.0.1:{server.port}") as ws:
            for bad in ("not json", "[1]", '{"type": "nope"}', b"\x00binary",
                        '{"type": "condition", "cid": 0}',
                        '{"type": "hello", "K": 4, "duration": -1}',
                        '{"type": "hello", "K": 9, "duration": 5}',
                        '{"type": "shape", "delay": 0.01, "jitter": 0.5}'):
                await ws.send(bad)
                errors.append(json.loads(await ws.recv())["error"])
            await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 2}))
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready"
            assert ready["bind"] == "start"  # a queued job takes its condition at dispatch
            await ws.send(json.dumps({"type": "condition", "cid": 0, "session": "s999"}))
            while True:
                message = await ws.recv()
                if isinstance(message, str) and json.loads(message)["type"] == "error":
                    errors.append(json.loads(message)["error"])
                    assert json.loads(message)["cid"] == 0  # names the refused condition
                    break
            await ws.send(json.dumps({"type": "bye"}))
        return errors

    errors = asyncio.run(probe_errors())
    assert len(errors) == 9
    assert "not JSON" in errors[0] and "unknown message type" in errors[2]
    assert "binary" in errors[3] and "before hello" in errors[4]
    assert "duration" in errors[5] and "K=9 is not served" in errors[6]
    assert "jitter" in errors[7] and "s999" in errors[8] and "refused" in errors[8]
    assert _client(server, tmp_path / "after")["status"] == "complete"


def test_a_viewer_that_disconnects_leaves_the_others_served(server, tmp_path):
    from websockets.asyncio.client import connect

    async def leave_midway() -> None:
        async with connect(f"ws://127.0.0.1:{server.port}") as ws:
            await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 6}))
            await asyncio.sleep(1.5)  # playing; then the connection drops without a bye

    other = threading.Thread(target=asyncio.run, args=(leave_midway(),))
    other.start()
    summary = _client(server, tmp_path / "stays", duration=5.0, times=(0.5, 2.0, 3.5))
    other.join()
    assert summary["status"] == "complete" and summary["n_displayed"] == 3
    deadline = time.time() + 10
    while server.sessions and time.time() < deadline:
        time.sleep(0.05)
    assert not server.sessions  # the dropped session ended too


def test_a_server_that_stops_leaves_a_partial_run_folder(tmp_path):
    built = StreamServer(ServerConfig(GeneratorConfig("tiny", "tiny", 2), Ks=(4,), port=0,
                                      warmup=3))
    built.prepare()
    thread = ServerThread(built)
    with thread:
        threading.Timer(2.5, thread.stop).start()
        summary = _client(built, tmp_path / "cut", times=(0.5, 1.5, 4.0, 6.0), duration=8.0)
    assert summary["status"] == "interrupted"
    config = read_run_folder(tmp_path / "cut").config
    assert config["status"] == "interrupted" and config["end_time"] < 4.0
    records = read_viewer_records(tmp_path / "cut")
    assert [c.status for c in records.conditions][:2] == ["shown", "shown"]
    assert len(records.conditions) == 2  # the later ones were never sent
    assert all(math.isfinite(s.t_received) for s in records.slots)


@pytest.mark.parametrize("command", [
    ["measure", "--generator", "sleep", "--cost", "fixed:0.01", "--K", "2", "--duration", "1"],
    ["client", "ws://127.0.0.1:9"]])
def test_a_named_pipe_as_trace_is_refused_as_every_input_refuses_one(tmp_path, command):
    """measure's and client's --trace said "no such file" of a FIFO; the message is now
    the one every other input path gives (tests/test_run_folder.py)."""
    import os
    import subprocess
    import sys

    pipe = tmp_path / "trace"
    os.mkfifo(pipe)
    done = subprocess.run([sys.executable, "-c", "from latsim.cli import main; main()",
                           *command, "--trace", str(pipe), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"latsim: error: --trace {pipe}: cannot read: a named "
                                   "pipe or socket, not a file")


def test_bad_client_options_and_unreachable_servers_are_one_line_errors(tmp_path):
    trace = Trace("t", (1.0,), 2.0)
    with pytest.raises(LatsimError, match="ws://"):
        ClientConfig("http://x", trace, tmp_path)
    with pytest.raises(LatsimError, match="playout"):
        ClientConfig("ws://x", trace, tmp_path, playout_delay=-1)
    with pytest.raises(LatsimError, match="cannot connect"):
        run_client(ClientConfig("ws://127.0.0.1:9", trace, tmp_path / "x",
                                connect_timeout=2))
    assert read_run_folder(tmp_path / "x").config["status"] == "failed"
    # a listener that never answers the handshake: the error says so (it ended in ": ")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        with pytest.raises(LatsimError, match=r"cannot connect .*: no answer within 0\.5 s$"):
            run_client(ClientConfig(f"ws://127.0.0.1:{silent.getsockname()[1]}", trace,
                                    tmp_path / "y", connect_timeout=0.5))
    finally:
        silent.close()
    with pytest.raises(LatsimError, match="schedule"):
        ServerConfig(schedule="random")


@pytest.mark.parametrize("schedule", ["fifo", "least-slack", "replan-first"])
def test_the_server_and_the_simulator_pick_with_one_implementation(schedule):
    import numpy as np

    from latsim.model.costs import FixedCost
    from latsim.model.generators import StagedGenerator
    from latsim.model.serving import ServingConfig
    from latsim.sim.clock import Clock
    from latsim.sim.serving import _Engine

    device = SharedDevice(_FakeGenerator(threading.Event()), schedule)
    engine = _Engine(Clock(), ServingConfig(schedule=schedule),
                     np.random.default_rng(0), StagedGenerator(FixedCost(1.0)))
    try:
        assert device.schedule is engine.schedule
        assert device.schedule.__module__ == "latsim.model.schedules"
    finally:
        device.stop()


def test_serve_refuses_an_address_it_cannot_listen_on_before_any_warm_up():
    from typer.testing import CliRunner

    from latsim.cli import app

    result = CliRunner().invoke(app, ["serve", "--generator", "sleep", "--cost", "fixed:0.1",
                                      "--host", "192.0.2.1", "--port", "8766",
                                      "--allow-anonymous"])
    assert result.exit_code == 2, result.output
    assert "cannot listen on 192.0.2.1:8766" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("latsim: error: cannot listen")
    assert "warming up" not in result.output
    # without --allow-anonymous (and no token) a foreign address is refused first
    result = CliRunner().invoke(app, ["serve", "--generator", "sleep", "--cost", "fixed:0.1",
                                      "--host", "192.0.2.1", "--port", "8766"])
    assert result.exit_code == 2 and "without a token" in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_viewers_strings_are_bounded_and_the_servers_long_texts_still_parse():
    from harness.net.wire import FROM_CLIENT, FROM_SERVER, MAX_STRING, parse_message

    long = "x" * (MAX_STRING + 1)
    with pytest.raises(ProtocolError, match=f"longer than {MAX_STRING}"):
        parse_message(json.dumps({"type": "hello", "K": 4, "duration": 5, "policy": long}),
                      FROM_CLIENT)
    refused = parse_message(json.dumps({"type": "error", "error": long}), FROM_SERVER)
    assert refused.error == long  # e.g. a refusal listing every K the server offers


def test_client_json_is_the_envelope_with_the_simulators_key_names(server, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"t": t}) + "\n" for t in (0.8, 2.1)))
    result = CliRunner().invoke(app, ["client", f"ws://127.0.0.1:{server.port}", "--K", "4",
                                      "--trace", str(trace), "--duration", "3", "--out",
                                      str(tmp_path / "run"), "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    payload = envelope_of(result.stdout)
    (row,) = payload["rows"]
    assert payload["seed"] == 5 and payload["command"][:2] == ["latsim", "client"]
    # the names simulate --streams uses for the same quantities
    assert {"window_s", "stall_pct", "client_stall_pct", "viewer_stall_pct", "L50"} <= set(row)
    assert "window" not in row and "server_stall_pct" not in row
    assert row == json.loads((tmp_path / "run" / "summary.json").read_text())
