"""End to end on loopback: ``latsim serve`` in its own process (tiny preset, CPU), two
``latsim client`` sessions at once for 20 s with 20 ms +- 5 ms shaped one-way delay each
way, then ``latsim compare`` on the client runs (issue 12's targets: L50 within 5%, L95
within 10%, viewer stall within 0.5 pp, of the range one run shows in the prediction), and a
server killed mid-session."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("websockets")

from harness.net.netclock import Shaper
from harness.viewer.client import ClientConfig, run_client
from latsim.analysis.viewer_compare import compare_client_runs
from latsim.model.traces import Trace
from latsim.run.folder import read_run_folder
from latsim.run.viewer import read_viewer_records
from tests.helpers import error_to_band

pytestmark = pytest.mark.slow

SERVE = [sys.executable, "-c", "from latsim.cli import main; main()", "serve", "--port", "0",
         "--K", "4", "--steps", "2", "--warmup", "5"]


def _start_server(*extra: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*SERVE, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    deadline = time.time() + 120
    assert proc.stdout is not None
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        found = re.search(r"ws://127\.0\.0\.1:(\d+)", line)
        if found:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
            return proc, int(found.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("the server did not start: " + "".join(lines))


def _trace(seed: int, duration: float = 20.0) -> Trace:
    """Conditions every ~0.9 s, spread over the slot phase (deterministic)."""
    times, t = [], 0.6 + 0.07 * seed
    while t < duration - 0.5:
        times.append(round(t, 4))
        t += 0.83 + 0.11 * ((len(times) * 7 + seed) % 5)
    return Trace(f"e2e{seed}", tuple(times), duration)


def test_two_viewers_twenty_seconds_meet_the_prediction(tmp_path):
    proc, port = _start_server()
    summaries: dict[str, dict] = {}
    try:
        def viewer(name: str, seed: int, policy: str) -> None:
            summaries[name] = run_client(ClientConfig(
                f"ws://127.0.0.1:{port}", _trace(seed), tmp_path / name, K=4, policy=policy,
                playout_delay=0.1, uplink=Shaper(0.02, 0.005), seed=seed))

        threads = [threading.Thread(target=viewer, args=("a", 1, "speculative")),
                   threading.Thread(target=viewer, args=("b", 2, "baseline"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert set(summaries) == {"a", "b"}
    sessions = {summaries[n]["session"] for n in "ab"}
    assert len(sessions) == 2  # one session each, on one server
    # predicted together: two streams sharing the server's one device
    rows = dict(zip("ab", compare_client_runs([tmp_path / "a", tmp_path / "b"],
                                              replications=100).rows, strict=True))
    for name in "ab":
        summary = summaries[name]
        assert summary["status"] == "complete", summary["stop_reason"]
        assert summary["n_displayed"] == summary["n_conditions"] >= 18
        # loopback: the two clocks are one, so the estimate is within its bound of 0
        assert abs(summary["offset"]) <= summary["offset_uncertainty"] + 1e-6
        # uplink + deliver: the offset's error cancels; 2 x 20 ms shaped, plus handling
        assert 0.038 <= summary["uplink_mean"] + summary["deliver_mean"] <= 0.08
        row = rows[name]
        assert row["predicted_with"] == 2
        assert error_to_band(row, "L50") <= 5, row
        assert error_to_band(row, "L95") <= 10, row
        assert error_to_band(row, "viewer_stall_pct") <= 0.5, row
    speculative, baseline = summaries["a"], summaries["b"]
    assert speculative["L50"] < baseline["L50"]  # the policy still shows from the viewer's side


def test_a_killed_server_leaves_the_client_a_partial_folder(tmp_path):
    proc, port = _start_server()
    threading.Timer(4.0, proc.kill).start()  # SIGKILL: no end message, the socket just dies
    try:
        summary = run_client(ClientConfig(f"ws://127.0.0.1:{port}", _trace(3, 12.0),
                                          tmp_path / "cut", K=4))
    finally:
        proc.wait(30)
    assert summary["status"] == "interrupted"
    assert "connection" in summary["stop_reason"]
    config = read_run_folder(tmp_path / "cut").config
    assert config["status"] == "interrupted" and config["end_time"] < 6.0
    records = read_viewer_records(tmp_path / "cut")
    assert records.slots and records.jobs
    assert any(c.status == "shown" for c in records.conditions)
    assert all(c.t_sent <= config["end_time"] for c in records.conditions)
    # compared over the window it covers, and said to be partial
    (row,) = compare_client_runs([tmp_path / "cut"], replications=5).rows
    assert row["predicted_with"] == 1  # a partial run is predicted alone
    assert row["status"] == "interrupted" and "partial" in row["notes"]
    assert row["window_s"] == pytest.approx(config["end_time"])
