"""The browser viewer (``harness/viewer/web``): ``latsim serve`` serves it over HTTP at ``/``,
and in a real browser (headless Chromium through Selenium, :mod:`harness.tools.browser`) it
measures a session that ``latsim compare`` reads as it reads ``latsim client``'s, within the
same targets (``tests/test_live_e2e.py``: L50 within 5%, L95 within 10%, viewer stall within
0.5 pp), at D = 0.5 s and at D = 0.1 s, where the display's refresh is a larger part of L
and the prediction must model it (:mod:`latsim.model.display`). The server is the ``sleep``
generator on loopback; the page replays a trace from its URL."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request

import pytest

pytest.importorskip("websockets")

from typer.testing import CliRunner

from harness.serve.config import ServerConfig
from harness.serve.server import ServerThread, StreamServer
from harness.tools import browser
from latsim.analysis.viewer_compare import ClientRun, load_client_run
from latsim.cli.root import app
from latsim.plugins import GeneratorConfig
from latsim.run.folder import read_run_folder
from latsim.run.viewer import read_viewer_records
from tests.helpers import error_to_band

TOKEN = "browser-test-token"
#: 11 conditions over a 10 s session, spread over the slot phase (δ = 0.25 s)
TRACE = tuple(round(0.6 + 0.83 * i, 2) for i in range(11))
DURATION = 10.0
#: (D, the server's --max-sessions). A frame is on screen at the page's next display refresh
#: after the playout rule's time: 0 to 16.7 ms at 60 Hz, the same all session (δ is 15
#: refreshes), which the prediction models (latsim.model.display). With the default 8
#: sessions the lead holds a wait budget for 7 others' jobs (L50 about 0.67 s at D = 0.1 s,
#: 1.07 s at 0.5 s); with one session it holds none, and at D = 0.1 s L50 is about 0.26 s:
#: there the refresh alone is up to 6% of L50, more than the target, unless modelled.
SESSIONS = ((0.5, 8), (0.1, 1))


def _server(**config) -> StreamServer:
    built = StreamServer(ServerConfig(GeneratorConfig(cost="fixed:0.05"),
                                      generator_name="sleep", Ks=(4,), port=0, warmup=2,
                                      **config))
    built.prepare()
    return built


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # loopback
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_serve_serves_the_page_without_a_token_and_the_websocket_only_with_it():
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    built = _server(token=TOKEN)
    with ServerThread(built) as port:
        base = f"http://127.0.0.1:{port}"
        status, headers, body = _get(base + "/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Cache-Control"] == "no-cache"
        assert b'id="latsim-summary"' in body and b'src="viewer.js"' in body
        status, headers, body = _get(base + "/viewer.js?x=1")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert b"requestAnimationFrame" in body
        assert _get(base + "/nothing-here")[0] == 401  # anything else: the handshake's rules

        async def attempt(path: str) -> str:
            try:
                async with connect(f"ws://127.0.0.1:{port}{path}", open_timeout=5):
                    return "open"
            except InvalidStatus as exc:
                return str(exc.response.status_code)

        assert asyncio.run(attempt("/")) == "401"  # the page is free, the stream is not
        assert asyncio.run(attempt(f"/?token={TOKEN}")) == "open"
    assert built.refused == 2  # /nothing-here and the tokenless WebSocket


def _driver():
    reason = browser.missing()
    if reason is not None:
        pytest.skip(reason)
    return browser.chromium_driver()


@pytest.mark.parametrize(("playout_delay", "max_sessions"), SESSIONS,
                         ids=[f"D{d:g}-sessions{m}" for d, m in SESSIONS])
def test_a_browser_session_replays_its_trace_and_meets_the_prediction(
        tmp_path, monkeypatch, playout_delay, max_sessions):
    driver = _driver()
    built = _server(token=TOKEN, max_sessions=max_sessions)
    with ServerThread(built) as port:
        session = browser.replay(driver, port, TOKEN, TRACE, DURATION, playout_delay)
    state, summary, files = session.state, session.summary, session.files
    low, high = session.offset_bounds
    assert state == "complete", summary
    assert summary["status"] == "complete" and summary["stop_reason"] == "complete", summary
    assert summary["viewer"] == "browser" and summary["n_errors"] == 0, summary["errors"]
    assert summary["n_conditions"] == summary["n_displayed"] == len(TRACE)
    # the page's min-RTT offset agrees with one measured from outside, within its bound
    bound = summary["offset_uncertainty"]
    assert 0 < bound < 0.05
    assert low - bound - 1e-3 <= summary["offset"] <= high + bound + 1e-3, (low, high, summary)
    assert summary["n_probes"] >= 16 + 15  # the burst, then one every 0.5 s

    assert set(files) == {"config.json", "summary.json", "trace.jsonl", "conditions.csv",
                          "slots.csv", "stalls.csv", "jobs.csv", "probes.csv"}
    run = session.write(tmp_path / "browser")
    folder = read_run_folder(run)
    assert folder.config["kind"] == "client" and folder.config["status"] == "complete"
    assert folder.config["server_run"] == built.run_id and folder.config["r"] == 4
    assert folder.config["bind"] == "start"  # as the server said: predicted like for like
    records = read_viewer_records(run)
    assert [c.status for c in records.conditions] == ["shown"] * len(TRACE)
    for c in records.conditions:
        assert (c.t_sent < c.t_arrival <= c.t_start < c.t_ready <= c.t_play < c.t_received
                <= c.t_displayed)
        assert c.L == pytest.approx(c.t_displayed - c.t_sent)
    # each slot's display is a requestAnimationFrame frame at or after the rule's time
    lateness = [s.t_displayed - s.t_shown for s in records.slots if math.isfinite(s.t_displayed)]
    assert len(lateness) == len(records.slots) >= DURATION / 0.25 - 2
    assert min(lateness) >= -1e-6 and max(lateness) < 0.1, (min(lateness), max(lateness))
    assert [s.position for s in records.slots] == sorted(s.position for s in records.slots)
    # the page measured its refresh period from every frame (one per refresh, or more where
    # it skipped one), and the clock fitted to the slots that showed no condition first puts
    # each condition's frame where it was drawn: within twice the fit's own largest residual
    # (the timestamps' jitter bounds both the fitted phase's error and a new frame's)
    display = folder.config["display"]
    assert display["period"] > 0 and display["frames"] <= display["refreshes"] + 1, display
    fit = load_client_run(run).display()
    assert fit is not None and fit.period_source == "measured"
    assert fit.refresh.period == pytest.approx(display["period"])
    assert fit.n >= len(records.slots) - len(TRACE)  # the slots that showed no condition
    # (on the refresh clock: a frame the page skipped on a loaded machine is drawn a whole
    # refresh later, on the same clock)
    period, phase = fit.refresh.period, fit.refresh.phase
    off = [abs((c.t_displayed - phase + period / 2) % period - period / 2)
           for c in records.conditions]
    assert max(off) <= 2 * fit.spread, (off, fit)

    # latsim compare reads it as a client run and predicts it within the client's targets
    result = CliRunner().invoke(app, ["compare", str(run), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "cmp" / "compare_viewer.json").read_text())["rows"]
    assert row["run"] == "browser" and row["status"] == "complete"
    assert row["L50_measured"] == pytest.approx(summary["L50"])
    assert row["display_period_source"] == "measured"
    # for the record: the same prediction without the display step (the model before it)
    monkeypatch.setattr(ClientRun, "display", lambda self: None)
    CliRunner().invoke(app, ["compare", str(run), "--out", str(tmp_path / "plain")])
    (plain,) = json.loads((tmp_path / "plain" / "compare_viewer.json").read_text())["rows"]
    print(f"browser session at D = {playout_delay:g} s: L50 {row['L50_measured']:.4f} s "
          f"({row['L50_err_pct']:+.2f}%, {plain['L50_err_pct']:+.2f}% without the refresh), "
          f"L95 {row['L95_measured']:.4f} s ({row['L95_err_pct']:+.2f}%, "
          f"{plain['L95_err_pct']:+.2f}%), L_mean {row['L_mean_err_pct']:+.2f}% "
          f"({plain['L_mean_err_pct']:+.2f}%), viewer stall "
          f"{row['viewer_stall_pct_measured']:.2f}% ({row['viewer_stall_pct_abs_err']:+.2f} pp);"
          f" refresh period {row['display_period'] * 1e3:.4f} ms, phase "
          f"{row['display_phase'] * 1e3:.2f} ms (spread {row['display_phase_spread'] * 1e3:.3f}"
          f" ms), step {row['display_step_measured'] * 1e3:.2f} ms measured, "
          f"{row['display_step_predicted'] * 1e3:.2f} ms predicted")
    # against the range one run of the prediction shows (tests/helpers.error_to_band): an
    # L50 over 11 conditions is quantized by the job schedule (-5.6 % from the pooled
    # median failed a correct CI run)
    assert error_to_band(row, "L50") <= 5, row
    assert error_to_band(row, "L95") <= 10, row
    assert error_to_band(row, "viewer_stall_pct") <= 0.5, row
