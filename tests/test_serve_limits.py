"""``latsim serve`` holds its limits: admission under concurrency, connections that never say
hello, tokens and origins, condition floods, slow readers, and a graceful stop on SIGTERM
(the ``sleep`` generator: no torch, on loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("websockets")

from harness.serve.config import ServerConfig
from harness.serve.server import DEVICE_TASKS, ServerThread, StreamServer
from latsim.errors import LatsimError
from latsim.model.lead import AUTO_STALL
from latsim.plugins import GeneratorConfig
from latsim.run.folder import read_run_folder


def _server(**config) -> StreamServer:
    built = StreamServer(ServerConfig(GeneratorConfig(cost="fixed:0.05"),
                                      generator_name="sleep", Ks=(4,), port=0, warmup=2,
                                      **config))
    built.prepare()
    return built


async def _hello(port: int, duration: float = 3.0) -> tuple[list[str], int | None, str]:
    """One viewer: hello, then every text message's type until the server closes (or 6 s
    of quiet), and the close code and reason."""
    messages, code, reason = await _session(port, duration, until_end=False, quiet_s=6.0)
    return [m["type"] for m in messages], code, reason


async def _viewer(port: int, duration: float) -> list[dict]:
    """One viewer: hello, then every text message up to ``end`` (or a close, or 10 s)."""
    return (await _session(port, duration, until_end=True, quiet_s=10.0))[0]


async def _session(port: int, duration: float, until_end: bool, quiet_s: float
                   ) -> tuple[list[dict], int | None, str]:
    from websockets.asyncio.client import connect

    messages: list[dict] = []
    async with connect(f"ws://127.0.0.1:{port}") as ws:
        await ws.send(json.dumps({"type": "hello", "K": 4, "duration": duration}))
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), quiet_s)
                if isinstance(message, str):
                    messages.append(json.loads(message))
                    if until_end and messages[-1]["type"] == "end":
                        break
        except Exception:  # noqa: BLE001 - the close ends the viewer either way
            pass
        return messages, ws.close_code, ws.close_reason


def _client_process(tmp_path, port: int, times: tuple[float, ...], **popen):
    """``latsim client`` in its own process, a 10 s session of ``times``, into
    ``tmp_path/run``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"t": t}) + "\n" for t in times))
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from latsim.cli import main; "
         "sys.argv[0] = 'latsim'; main()", "client", f"ws://127.0.0.1:{port}",
         "--trace", str(trace), "--duration", "10", "--out", str(tmp_path / "run")], **popen)


def test_simultaneous_hellos_admit_exactly_max_sessions():
    # every hello comes from 127.0.0.1: the per-address bound before hello (8) would
    # refuse most of them first, so it is lifted here
    built = _server(max_sessions=2, max_pending_per_address=64)
    with ServerThread(built) as port:
        async def many() -> list:
            return await asyncio.gather(*(_hello(port, 1.0) for _ in range(24)))

        outcomes = asyncio.run(many())
    served = [o for o in outcomes if o[0][:1] == ["ready"]]
    refused = [o for o in outcomes if o[0][:1] == ["error"]]
    assert len(served) == 2 and len(refused) == 22
    assert all(o[0][-1] == "end" for o in served)
    assert all(o[1] == 1013 and "server full" in o[2] for o in refused)
    assert built.refused == 22


def test_connections_that_never_say_hello_are_dropped_and_capped():
    from websockets.asyncio.client import connect

    built = _server(hello_timeout=0.5, max_pending=3, max_pending_per_address=3)
    with ServerThread(built) as port:
        async def silent() -> tuple:
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                try:
                    message = await asyncio.wait_for(ws.recv(), 5.0)
                    await asyncio.wait_for(ws.recv(), 5.0)
                except Exception:  # noqa: BLE001 - closed after the error
                    pass
                return json.loads(message)["error"], ws.close_code

        async def crowd() -> list:
            return await asyncio.gather(*(silent() for _ in range(5)))

        started = time.perf_counter()
        outcomes = asyncio.run(crowd())
        took = time.perf_counter() - started
    waited = [o for o in outcomes if "no hello within 0.5 s" in o[0]]
    crowded = [o for o in outcomes if "too many connections" in o[0]]
    assert len(waited) == 3 and len(crowded) == 2
    assert {o[1] for o in waited} == {1008} and {o[1] for o in crowded} == {1013}
    assert took < 5.0  # bounded by the hello timeout, not held open


def test_one_address_cannot_take_every_place_before_hello():
    """127.0.0.2 holds its share of the connections that have not said hello; a viewer
    from 127.0.0.1 still gets a session (both loopback, one server)."""
    from websockets.asyncio.client import connect

    built = _server(hello_timeout=3.0, max_pending=4, max_pending_per_address=2)
    with ServerThread(built) as port:
        async def silent() -> str:
            async with connect(f"ws://127.0.0.1:{port}", local_addr=("127.0.0.2", 0)) as ws:
                try:
                    return json.loads(await asyncio.wait_for(ws.recv(), 5.0))["error"]
                except Exception as exc:  # noqa: BLE001 - closed after the error
                    return repr(exc)

        async def scene() -> tuple:
            hogs = [asyncio.create_task(silent()) for _ in range(3)]
            await asyncio.sleep(0.5)  # the hogs hold their places
            viewer = await _hello(port, 1.0)
            return await asyncio.gather(*hogs), viewer

        hogs, viewer = asyncio.run(scene())
    assert viewer[0][:1] == ["ready"] and viewer[0][-1] == "end"
    assert sum("too many connections from 127.0.0.2" in h for h in hogs) == 1
    assert sum("no hello within 3 s" in h for h in hogs) == 2


def test_by_default_two_addresses_cannot_lock_the_others_out():
    """The defaults (--max-pending 64, 8 per address): two clients (127.0.0.2 and
    127.0.0.3) opening 40 idle connections each hold 8 places each and are refused the
    rest, and a viewer from 127.0.0.1 still gets its session. (At 32 per address, the
    default before, these two held all 64.)"""
    from websockets.asyncio.client import connect

    built = _server(hello_timeout=4.0)
    with ServerThread(built) as port:
        async def silent(address: str) -> str:
            async with connect(f"ws://127.0.0.1:{port}", local_addr=(address, 0)) as ws:
                try:
                    return json.loads(await asyncio.wait_for(ws.recv(), 8.0))["error"]
                except Exception as exc:  # noqa: BLE001 - closed after the error
                    return repr(exc)

        async def scene() -> tuple:
            hogs = [asyncio.create_task(silent(address))
                    for address in ("127.0.0.2", "127.0.0.3") for _ in range(40)]
            await asyncio.sleep(1.0)  # the hogs hold their places
            viewer = await _hello(port, 1.0)
            return await asyncio.gather(*hogs), viewer

        hogs, viewer = asyncio.run(scene())
    assert viewer[0][:1] == ["ready"] and viewer[0][-1] == "end"
    for address in ("127.0.0.2", "127.0.0.3"):
        assert sum(f"too many connections from {address}" in h for h in hogs) == 32
    assert sum("no hello within 4 s" in h for h in hogs) == 16


def test_idle_connections_from_eight_addresses_do_not_lock_the_others_out():
    """The defaults (--max-pending 64, 8 per address): eight addresses holding 8 idle
    connections each fill every place before hello, and open another as soon as one is
    closed (issue 51: no honest viewer got in until the hello timeout, wave after wave).
    Each viewer from a ninth address (two, one after the other) takes the oldest place of a
    largest holder, which is told so and closed (1013), and gets its session at once."""
    from websockets.asyncio.client import connect

    built = _server(hello_timeout=30.0)
    hog_addresses = [f"127.0.0.{n}" for n in range(2, 10)]
    closed: list[tuple[str, int | None]] = []
    with ServerThread(built) as port:
        async def silent(address: str) -> None:
            while True:  # an idle connection, again as soon as the server closes it
                async with connect(f"ws://127.0.0.1:{port}", local_addr=(address, 0),
                                   close_timeout=0.1) as ws:
                    reason = "closed without an error"
                    with contextlib.suppress(Exception):
                        reason = json.loads(await ws.recv())["error"]
                        await ws.recv()
                    closed.append((reason, ws.close_code))

        async def scene() -> tuple:
            hogs = [asyncio.create_task(silent(address))
                    for address in hog_addresses for _ in range(8)]
            while len(built._waiting) < 64:  # every place held
                await asyncio.sleep(0.05)
            viewers = []
            for _ in range(2):
                viewers.append([m["type"] for m in
                                await asyncio.wait_for(_viewer(port, 1.0), 15.0)])
                while len(built._waiting) < 64:  # the hogs hold every place again
                    await asyncio.sleep(0.05)
            for hog in hogs:
                hog.cancel()
            await asyncio.gather(*hogs, return_exceptions=True)
            return viewers

        viewers = asyncio.run(scene())
    assert all(v[:1] == ["ready"] and v[-1] == "end" for v in viewers)
    assert built._waiting.evictions == 2
    crowded = [reason for reason, code in closed if "the server is crowded" in reason]
    assert len(crowded) == 2 and {code for _, code in closed} == {1013}
    # a hog that came back while a viewer still held its place was refused outright
    assert all(reason in crowded or "too many connections" in reason
               for reason, _ in closed)


def test_a_probe_flood_is_cut_off_and_a_client_probing_as_usual_is_not():
    """Probes cost the server a reply each: past --max-probe-rate's bucket the connection
    is closed (1008). ``latsim client`` sends at most 100 a second (16 at 10 ms, then one
    every 0.5 s) and the other tests' viewers run under the default of 200."""
    from websockets.asyncio.client import connect

    built = _server(max_probe_rate=50.0)
    with ServerThread(built) as port:
        async def flood() -> tuple:
            replies, error, cut_off = 0, None, None
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                started = time.monotonic()
                for i in range(2000):
                    try:
                        await ws.send(json.dumps({"type": "probe", "t0": float(i)}))
                    except Exception:  # noqa: BLE001 - closed by the server
                        break
                try:
                    while True:
                        message = json.loads(await asyncio.wait_for(ws.recv(), 5.0))
                        if message["type"] == "probe":
                            replies += 1
                        elif message["type"] == "error":
                            error, cut_off = message["error"], time.monotonic()
                except Exception:  # noqa: BLE001 - the close ends it
                    pass
                await ws.wait_closed()
                return replies, error, ws.close_code, cut_off - started

        replies, error, code, elapsed = asyncio.run(flood())
    assert code == 1008 and "clock probes faster than 50 per s" in error
    # the bucket's 50, and what refilled while the probes came: the server saw them all
    # within the client's ``elapsed`` (a loaded machine stretches it: 91 in a CI run)
    assert 50 <= replies <= 50 + math.ceil(50.0 * elapsed) + 1
    assert replies < 2000


def test_bad_limits_are_one_line_errors():
    with pytest.raises(LatsimError, match="hello timeout"):
        ServerConfig(hello_timeout=0.0)
    with pytest.raises(LatsimError, match="--max-pending .* must be 1..4096, got 0"):
        ServerConfig(max_pending=0)
    with pytest.raises(LatsimError, match="probe rate must be 1..10000"):
        ServerConfig(max_probe_rate=0.5)
    with pytest.raises(LatsimError, match="--max-pending-per-address must be 1..4"):
        ServerConfig(max_pending=4, max_pending_per_address=5)
    assert ServerConfig().pending_per_address == 8
    assert ServerConfig(max_pending=3).pending_per_address == 3
    for origin in ("", "bogus", "http://a.com/path?x", "http://a.com/", "ftp://a.com",
                   "http://a.com:99999", " http://a.com"):  # accepted silently before
        with pytest.raises(LatsimError, match="is not an origin"):
            ServerConfig(origins=(origin,))
    assert ServerConfig(origins=("http://localhost:8765", "https://a.example")).origins


def test_sigterm_sends_every_viewer_end_then_closes(tmp_path):
    """``latsim serve`` in its own process: SIGTERM ends each session with an ``end``
    message and a normal close (1001), not an internal error (1011); the ``end`` message's
    summary is the session folder's (both over the window the records cover)."""
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from latsim.cli import main; "
         "sys.argv[0] = 'latsim'; main()", "serve", "--generator", "sleep", "--cost",
         "fixed:0.05", "--K", "4", "--port", "0", "--warmup", "2",
         "--out", str(tmp_path / "served")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            line = server.stdout.readline()
            if "ws://" in line:
                port = int(line.split("ws://")[1].split()[0].rsplit(":", 1)[1])
        assert port is not None, server.stderr.read()

        async def two_then_term() -> list:
            viewers = [asyncio.create_task(_session(port, 30.0, until_end=False, quiet_s=6.0))
                       for _ in range(2)]
            await asyncio.sleep(1.5)  # both playing
            os.kill(server.pid, signal.SIGTERM)
            return await asyncio.gather(*viewers)

        outcomes = asyncio.run(two_then_term())
        assert server.wait(30) == 0
    finally:
        server.kill()
    for messages, code, _ in outcomes:
        types = [m["type"] for m in messages]
        assert types[0] == "ready" and types[-1] == "end", types
        assert code == 1001
        end = messages[-1]
        assert end["status"] == "interrupted"
        folder = read_run_folder(tmp_path / "served" / messages[0]["session"])
        shared = set(end["summary"]) & set(folder.summary)
        assert {"stall_pct", "busy_pct", "L_mean", "L99", "n_conditions", "dit_calls",
                "window_s", "L_basis"} <= shared
        assert ({key: end["summary"][key] for key in shared}
                == {key: folder.summary[key] for key in shared})
    assert "latsim serve: stopped" in server.stderr.read()


def test_the_clients_exit_status_tells_a_failed_session_from_one_cut_short(tmp_path):
    """A session the server failed (its job hung past --job-timeout) exits 2 with one line
    and a folder saying failed; one whose server stopped mid-session exits 3 and says
    interrupted (both exited 0 before, the failed one's folder saying interrupted)."""
    hung = StreamServer(ServerConfig(GeneratorConfig(cost="fixed:1.5"), generator_name="sleep",
                                     Ks=(4,), port=0, warmup=1, job_timeout=0.5))
    hung.prepare()
    with ServerThread(hung) as port:
        client = _client_process(tmp_path / "failed", port, (0.5,), stderr=subprocess.PIPE,
                                 text=True)
        code = client.wait(60)
    stderr = client.stderr.read()
    assert code == 2 and stderr.startswith("latsim: error: the server failed session "), stderr
    assert "hung" in stderr and stderr.count("\n") == 1
    assert read_run_folder(tmp_path / "failed" / "run").config["status"] == "failed"

    stopped = _server()
    with ServerThread(stopped) as port:
        client = _client_process(tmp_path / "cut", port, (0.5, 1.0), stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.time() + 30
        while (not (tmp_path / "cut" / "run" / "config.json").exists()
               and time.time() < deadline):
            time.sleep(0.05)
        time.sleep(1.5)  # the session is playing; leaving the block stops the server
    code = client.wait(60)
    stderr = client.stderr.read()
    assert code == 3 and "the session ended early" in stderr, stderr
    assert read_run_folder(tmp_path / "cut" / "run").config["status"] == "interrupted"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_client_stopped_by_a_signal_keeps_its_folder_and_exits_130(signum, tmp_path):
    from latsim.run.folder import read_run_folder

    built = _server()
    with ServerThread(built) as port:
        client = _client_process(tmp_path, port, (0.5, 1.0, 8.0), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while not (tmp_path / "run" / "config.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)  # the session is playing
        client.send_signal(signum)
        code = client.wait(30)
    stderr = client.stderr.read()
    assert code == 130, stderr
    assert stderr.startswith("latsim: interrupted: kept what was measured in "), stderr
    assert stderr.count("\n") == 1
    assert read_run_folder(tmp_path / "run").config["status"] == "interrupted"


def test_a_token_server_refuses_viewers_without_it_and_a_foreign_origin():
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    built = _server(token="s3cret-token", origins=("http://viewer.example",))
    with ServerThread(built) as port:
        url = f"ws://127.0.0.1:{port}"

        async def attempt(path: str = "", headers: dict | None = None) -> int | str:
            try:
                async with connect(url + path, additional_headers=headers or {}) as ws:
                    await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 1}))
                    return json.loads(await ws.recv())["type"]
            except InvalidStatus as exc:
                return exc.response.status_code

        async def all_of_them() -> list:
            bearer = {"Authorization": "Bearer s3cret-token"}
            return [await attempt(), await attempt("/?token=wrong"),
                    await attempt(headers={"Authorization": "Bearer nope-nope"}),
                    await attempt("/?token=s3cret-token"), await attempt(headers=bearer),
                    await attempt(headers={**bearer, "Origin": "http://evil.example"}),
                    await attempt(headers={**bearer, "Origin": "http://viewer.example"}),
                    # RFC 7235: the scheme is case-insensitive
                    await attempt(headers={"Authorization": "bearer s3cret-token"})]

        outcomes = asyncio.run(all_of_them())
    assert outcomes == [401, 401, 401, "ready", "ready", 403, "ready", "ready"]
    assert built.refused >= 3


def test_wrong_tokens_in_a_row_are_refused_outright_and_logged_sparingly(caplog):
    """About 1,000 guesses a second got a 401 and a log line each: past five wrong tokens
    in a row an address is refused before its token is compared (429), for a time that
    doubles with each further guess, and only the 1st, 2nd, 4th, 8th ... are logged."""
    import logging

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    built = _server(token="s3cret-token")
    with ServerThread(built) as port, caplog.at_level(logging.WARNING, "latsim.serve"):
        async def attempt(token: str) -> int | str:
            try:
                async with connect(f"ws://127.0.0.1:{port}/?token={token}") as ws:
                    await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 1}))
                    return json.loads(await ws.recv())["type"]
            except InvalidStatus as exc:
                return exc.response.status_code

        async def guesses() -> list:
            return [await attempt(f"guess-{i:04d}") for i in range(40)]

        outcomes = asyncio.run(guesses())
    assert outcomes[:5] == [401] * 5  # a typo or five cost nothing
    assert outcomes.count(429) >= 30, outcomes  # then most are not even compared
    logged = [r for r in caplog.records if "wrong token" in r.getMessage()]
    assert 1 <= len(logged) <= 6, [r.getMessage() for r in logged]


def test_without_allow_origin_only_the_servers_own_pages_may_connect_from_a_browser():
    """Any web page the user opened could drive a loopback server before: a browser's
    Origin must now be the server's own (its viewer page); a client without Origin (latsim
    client, scripts) is not a browser and connects as before."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    built = _server()
    with ServerThread(built) as port:
        async def attempt(headers: dict) -> int | str:
            try:
                async with connect(f"ws://127.0.0.1:{port}", additional_headers=headers) as ws:
                    await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 1}))
                    return json.loads(await ws.recv())["type"]
            except InvalidStatus as exc:
                return exc.response.status_code

        async def all_of_them() -> list:
            return [await attempt({}), await attempt({"Origin": f"http://127.0.0.1:{port}"}),
                    await attempt({"Origin": "http://evil.example"}),
                    await attempt({"Origin": "http://127.0.0.1:1"}),
                    await attempt({"Origin": "null"}),  # a file:// page
                    # a lookalike whose "port" is no number: a 500 with a traceback before
                    await attempt({"Origin": f"http://127.0.0.1:{port}.evil.example"})]

        def handshake(host: str) -> str:
            """The status line of an upgrade whose Origin and Host both name ``host`` (a
            page at that name, which DNS points at this loopback server)."""
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                raw.sendall((f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n"
                             f"Origin: http://{host}:{port}\r\nUpgrade: websocket\r\n"
                             "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
                return raw.recv(4096).split(b"\r\n", 1)[0].decode()

        outcomes = asyncio.run(all_of_them())
        rebound, own = handshake("evil.example"), handshake("localhost")
    assert outcomes == ["ready", "ready", 403, 403, 403, 403]
    assert built.refused >= 4
    assert " 403 " in rebound and " 101 " in own  # DNS rebinding answered 101 before


def test_a_non_loopback_bind_needs_a_token_or_says_it_is_anonymous():
    with pytest.raises(LatsimError, match="not loopback.*--token"):
        ServerConfig(host="0.0.0.0")
    ServerConfig(host="0.0.0.0", token="long-enough-token")
    ServerConfig(host="0.0.0.0", allow_anonymous=True)
    ServerConfig(host="::1")
    with pytest.raises(LatsimError, match="8 to 256"):
        ServerConfig(token="short")


def test_the_client_presents_its_token_and_names_a_refusal(tmp_path):
    from harness.viewer.client import ClientConfig, run_client
    from latsim.model.traces import Trace

    built = _server(token="s3cret-token")
    trace = Trace("t", (0.5,), 2.0)
    with ServerThread(built) as port:
        url = f"ws://127.0.0.1:{port}"
        with pytest.raises(LatsimError, match="refused the connection: HTTP 401"):
            run_client(ClientConfig(url, trace, tmp_path / "no"))
        summary = run_client(ClientConfig(url, trace, tmp_path / "yes", token="s3cret-token"))
    assert summary["status"] == "complete"


def test_a_right_token_gets_in_after_an_address_was_refused_for_wrong_ones(
        tmp_path, monkeypatch, caplog):
    """Six wrong tokens from 127.0.0.1 (someone else's, behind the same address) and the
    address is refused outright (429) for a while, before its tokens are compared: the
    429 says for how long (Retry-After), and ``latsim client`` with the right token waits
    that long and gets its session (it used to fail: "HTTP 429"). The first block is made
    2 s here (0.1 s by default), so the client surely meets it."""
    import logging

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    import harness.serve.server as server_module
    from harness.viewer.client import ClientConfig, retry_after, run_client
    from latsim.model.traces import Trace

    assert retry_after(429, {"Retry-After": "3"}) == 3.0
    assert retry_after(429, {"Retry-After": "Fri, 31 Dec 1999 23:59:59 GMT"}) is None
    assert retry_after(401, {"Retry-After": "3"}) is None
    monkeypatch.setattr(server_module, "FIRST_TOKEN_BACKOFF_S", 2.0)
    built = _server(token="s3cret-token")
    trace = Trace("t", (0.5,), 2.0)
    with ServerThread(built) as port, caplog.at_level(logging.WARNING, "latsim.client"):
        async def guesses() -> list:
            statuses = []
            for n in range(7):
                try:
                    async with connect(f"ws://127.0.0.1:{port}/?token=guess-{n:04}"):
                        statuses.append(101)
                except InvalidStatus as exc:
                    statuses.append((exc.response.status_code,
                                     exc.response.headers.get("Retry-After")))
            return statuses

        statuses = asyncio.run(guesses())
        summary = run_client(ClientConfig(f"ws://127.0.0.1:{port}", trace, tmp_path / "run",
                                          token="s3cret-token"))
    assert statuses == [(401, None)] * 6 + [(429, "2")]
    assert "HTTP 429, retrying in 2 s" in caplog.text
    assert summary["status"] == "complete"


def test_a_token_in_the_url_is_neither_stored_nor_echoed(tmp_path):
    """``latsim client ws://…/?token=T``: the browser page's way of passing the token is
    accepted, and the token appears in neither the folder's config.json nor an error."""
    from harness.viewer.client import ClientConfig, redacted, run_client
    from latsim.model.traces import Trace

    assert redacted("ws://h:1/?a=1&token=s3cret&b=2") == "ws://h:1/?a=1&token=***&b=2"
    assert redacted("wss://me:pw@h/") == "wss://me:***@h/"
    built = _server(token="s3cret-token")
    trace = Trace("t", (0.5,), 2.0)
    with ServerThread(built) as port:
        ok = run_client(ClientConfig(f"ws://127.0.0.1:{port}/?token=s3cret-token", trace,
                                     tmp_path / "yes"))
        with pytest.raises(LatsimError) as refused:
            run_client(ClientConfig(f"ws://127.0.0.1:{port}/?token=wrong-token-1", trace,
                                    tmp_path / "no"))
    assert ok["status"] == "complete"
    assert "s3cret" not in (tmp_path / "yes" / "config.json").read_text()
    assert "wrong-token-1" not in str(refused.value) and "token=***" in str(refused.value)
    with pytest.raises(LatsimError) as bad:
        ClientConfig("ws://h:port?token=s3cret-token", trace, tmp_path / "x")
    assert "s3cret" not in str(bad.value)


def test_a_condition_flood_is_held_back_to_the_rate_and_fps_is_capped(caplog):
    """50 conditions at once against a rate of 5 per second: the bucket's 5 are accepted,
    the next is refused, and then the server leaves the flooder's messages unread until
    the rate admits another (TCP holds the rest back: it used to parse and answer all 50
    at once, and log a line for each refusal), so its answers come no faster than the
    rate allows; the log has a line for the 1st, 2nd, 4th ... fault only."""
    import logging
    import time

    from websockets.asyncio.client import connect

    rate, burst, window = 5.0, 5, 3.0
    built = _server(max_condition_rate=rate, max_fps=24.0)
    with ServerThread(built) as port:
        async def flood() -> tuple[int, int, str, list[float]]:
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 1,
                                          "fps": 30}))
                too_fast = json.loads(await ws.recv())["error"]
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                await ws.send(json.dumps({"type": "hello", "K": 4, "duration": window}))
                assert json.loads(await ws.recv())["type"] == "ready"
                began = time.monotonic()
                for cid in range(50):  # at once: far over 5 per second
                    await ws.send(json.dumps({"type": "condition", "cid": cid}))
                acks = errors = 0
                answered = []
                while acks + errors < 50:
                    message = await ws.recv()
                    if isinstance(message, str):
                        kind = json.loads(message)["type"]
                        acks += kind == "ack"
                        errors += kind == "error"
                        if kind in ("ack", "error"):
                            answered.append(time.monotonic() - began)
                await ws.send(json.dumps({"type": "bye"}))
                return acks, errors, too_fast, answered

        with caplog.at_level(logging.WARNING, logger="harness.serve.server"):
            acks, errors, too_fast, answered = asyncio.run(flood())
    assert "--max-fps 24" in too_fast
    # the bucket's 5 and, within the window, no more than the rate admits
    assert burst <= acks <= burst + rate * window + 1 and errors == 50 - acks
    # in its first second at most the burst, and a refusal and an admission per 1/rate s
    # (a slower machine answers fewer: a bound from one side only)
    assert sum(t < 1.0 for t in answered) <= burst + 1 + 2 * rate
    faults = [r for r in caplog.records if "condition" in r.getMessage()]
    assert 1 <= len(faults) <= 1 + math.log2(errors)


def test_a_viewer_that_stops_reading_is_told_then_dropped_and_memory_stays_bounded(tmp_path):
    from websockets.asyncio.client import connect

    from harness.viewer.client import ClientConfig, run_client
    from latsim.model.traces import Trace

    built = StreamServer(ServerConfig(
        GeneratorConfig(cost="fixed:0.05", options=(("payload_bytes", str(2**20)),)),
        generator_name="sleep", Ks=(4,), port=0, warmup=2, max_queue_bytes=2**21,
        max_queue_frames=64, lag_grace=1.0))
    built.prepare()
    with ServerThread(built) as port:
        async def silent_viewer() -> None:
            async with connect(f"ws://127.0.0.1:{port}", max_queue=1, max_size=2**24) as ws:
                await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 60}))
                deadline = time.time() + 30
                while built.dropped == 0 and time.time() < deadline:
                    await asyncio.sleep(0.1)  # reads nothing

        honest = {}

        def viewer() -> None:  # beside it, a viewer that reads keeps its session
            honest.update(run_client(ClientConfig(
                f"ws://127.0.0.1:{port}", Trace("t", (0.5, 1.5), 3.0), tmp_path / "honest")))

        other = threading.Thread(target=viewer)
        other.start()
        asyncio.run(silent_viewer())
        other.join(60)
        deadline = time.time() + 20
        while built.sessions and time.time() < deadline:
            time.sleep(0.1)
    assert built.lagging >= 1 and built.dropped == 1
    assert built.peak_queue_bytes <= 2 * 2**21 + 2**20 + 4096  # twice the bound, one frame
    assert not built.sessions
    assert honest["status"] == "complete" and honest["n_displayed"] == 2


def test_a_slow_reader_is_told_ahead_of_its_backlog_then_dropped_by_the_server(caplog):
    """The lagging notice goes ahead of the frames queued before it (it used to wait behind
    them and rarely arrived); the drop is latsim's (1008, logged with its reason), not
    the keepalive's (1011)."""
    from websockets.asyncio.client import connect

    built = StreamServer(ServerConfig(
        GeneratorConfig(cost="fixed:0.05", options=(("payload_bytes", str(2**22)),)),
        generator_name="sleep", Ks=(4,), port=0, warmup=2, max_queue_bytes=2**23,
        max_queue_frames=64, lag_grace=0.5))
    built.prepare()
    with caplog.at_level("WARNING", logger="latsim.serve"), ServerThread(built) as port:
        async def slow_viewer() -> tuple:
            texts: list[dict] = []
            async with connect(f"ws://127.0.0.1:{port}", max_queue=1, max_size=2**24) as ws:
                await ws.send(json.dumps({"type": "hello", "K": 4, "duration": 60}))
                try:
                    while True:
                        message = await asyncio.wait_for(ws.recv(), 30.0)
                        if isinstance(message, str):
                            texts.append(json.loads(message))
                        await asyncio.sleep(0.3)  # about 3 messages a second: 4 come
                except Exception:  # noqa: BLE001 - the close ends it
                    pass
                return texts, ws.close_code

        texts, code = asyncio.run(slow_viewer())
    errors = [m["error"] for m in texts if m["type"] == "error"]
    assert any(e.startswith("lagging: ") for e in errors), texts
    assert code == 1008 and built.dropped == 1
    assert any("dropped: the viewer fell behind" in r.getMessage() for r in caplog.records)


def _json_values():
    from hypothesis import strategies as st

    leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                       st.floats(allow_nan=False), st.text(max_size=20))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=12)


def test_any_message_gets_a_reply_and_never_kills_the_connection(tmp_path):
    """Hypothesis-made messages (every message type, every field given any JSON value,
    extra keys, raw text and bytes) on one live connection each: afterwards the connection
    still answers a probe, and an honest viewer in the same run completes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from websockets.asyncio.client import connect

    from harness.net.wire import FROM_CLIENT
    from harness.viewer.client import ClientConfig, run_client
    from latsim.model.traces import Trace

    types = sorted(FROM_CLIENT)
    message = st.one_of(
        st.builds(lambda kind, fields: json.dumps({"type": kind, **fields}),
                  st.sampled_from(types), st.dictionaries(
                      st.sampled_from(["K", "duration", "policy", "fps", "r", "lead", "cid",
                                       "session", "t0", "delay", "jitter", "loss", "seed",
                                       "drain", "extra"]), _json_values(), max_size=5)),
        st.text(max_size=60), st.binary(max_size=60),
        _json_values().map(json.dumps))
    built = _server(max_condition_rate=1000.0)
    with ServerThread(built) as port:
        @settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(sent=message)
        def check(sent):
            async def talk() -> None:
                async with connect(f"ws://127.0.0.1:{port}") as ws:
                    await ws.send(sent)
                    await ws.send(json.dumps({"type": "probe", "t0": 1.0}))
                    while True:  # whatever the first got, the probe is answered
                        reply = await asyncio.wait_for(ws.recv(), 5.0)
                        if isinstance(reply, str) and "t1" in json.loads(reply):
                            return  # the probe's reply (type probe, with the server times)

            asyncio.run(talk())

        check()
        summary = run_client(ClientConfig(f"ws://127.0.0.1:{port}",
                                          Trace("t", (0.5, 1.5), 3.0), tmp_path / "honest"))
    assert summary["status"] == "complete" and summary["n_displayed"] == 2


def test_a_client_killed_outright_leaves_every_row_up_to_the_kill(tmp_path):
    from latsim.run.folder import read_run_folder
    from latsim.run.viewer import read_viewer_records

    built = _server()
    with ServerThread(built) as port:
        client = _client_process(tmp_path, port, (0.3, 0.9, 9.0), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not (tmp_path / "run" / "slots.csv").exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(3.0)  # the first two conditions have shown
        client.kill()
        client.wait(30)
    folder = read_run_folder(tmp_path / "run")
    assert folder.config["status"] == "running" and folder.state == "incomplete"
    records = read_viewer_records(tmp_path / "run")
    assert [c.status for c in records.conditions] == ["shown", "shown"]
    assert len(records.slots) >= 8 and all(s.t_displayed == s.t_displayed for s in records.slots)
    assert records.probes and records.jobs
    for c in records.conditions:
        assert c.L == pytest.approx(c.t_displayed - c.t_sent)
    # compare takes it as partial, over the window its rows cover
    from typer.testing import CliRunner

    from latsim.cli import app

    result = CliRunner().invoke(app, ["compare", str(tmp_path / "run"), "--replications", "2",
                                      "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "cmp" / "compare_viewer.json").read_text())["rows"][0]
    assert row["status"] == "running" and 2.5 < row["window_s"] < 6.0


def test_a_generator_error_fails_its_own_session_and_the_others_run_on(monkeypatch):
    """``LATSIM_FAULT`` reaches a server session's jobs: session 1's second job raises, and
    that viewer alone gets ``error`` then a failed ``end``; session 2 shares the device
    and completes with every slot it was due."""
    monkeypatch.setenv("LATSIM_FAULT", "raise@2/s1-")
    built = _server()
    with ServerThread(built) as port:
        async def both() -> list:
            return await asyncio.gather(_viewer(port, 3.0), _viewer(port, 3.0))

        first, second = asyncio.run(both())
    by_session = {m[0]["session"]: m for m in (first, second) if m and m[0]["type"] == "ready"}
    assert sorted(s.split("-")[0] for s in by_session) == ["s1", "s2"]
    (failed,) = [m for s, m in by_session.items() if s.startswith("s1-")]
    (honest,) = [m for s, m in by_session.items() if s.startswith("s2-")]
    assert [m["type"] for m in failed[-2:]] == ["error", "end"]
    assert "job 2" in failed[-2]["error"] and "raised" in failed[-2]["error"]
    assert failed[-1]["status"] == "failed"
    assert honest[-1]["type"] == "end" and honest[-1]["status"] == "complete"
    assert "error" not in [m["type"] for m in honest]


def test_a_hung_session_job_times_out_and_the_device_serves_the_next_viewer(monkeypatch):
    """A 60 s stall of session 1's second job, with ``job_timeout`` 1 s: that session fails
    as hung within a few seconds (the stall is abandoned, freeing the device), and a viewer
    after it is served to completion."""
    monkeypatch.setenv("LATSIM_FAULT", "stall@2:60/s1-")
    built = _server(job_timeout=1.0)
    with ServerThread(built) as port:
        started = time.perf_counter()
        hung = asyncio.run(_viewer(port, 3.0))
        took = time.perf_counter() - started
        after = asyncio.run(_viewer(port, 2.0))
    assert [m["type"] for m in hung[-2:]] == ["error", "end"]
    assert hung[-1]["status"] == "failed" and "hung" in hung[-2]["error"]
    assert took < 30.0  # bounded by the timeout, not the 60 s stall
    assert after[-1]["type"] == "end" and after[-1]["status"] == "complete"
    with pytest.raises(LatsimError, match="--job-timeout"):
        ServerConfig(job_timeout=0.0)


def test_the_default_lead_budgets_for_the_other_sessions_jobs():
    """One stream's lead, plus max_sessions - 1 jobs at the largest warm-up p99 over the
    Ks (a session holds one job at a time: on the FIFO device that many can be ahead;
    under another schedule each may also overtake it once, twice that)."""
    from harness.live.lead import Warmup, choose_lead
    from harness.serve.server import shared_device_leads
    from latsim.model.lead import LIVE
    from latsim.plugins import JobTiming

    def warm(K: int, seconds: float) -> Warmup:
        return Warmup(K, 0, tuple(JobTiming(-i, "refill", K, K, 0, 0, 0.0, seconds, None, 0, 0)
                                  for i in range(1, 6)))

    warmups = {4: warm(4, 0.02), 8: warm(8, 0.05)}
    leads = shared_device_leads(warmups, max_sessions=3)
    for K, warmup in warmups.items():
        alone = choose_lead(LIVE, [warmup]).lead
        assert leads[K].lead == pytest.approx(alone + 2 * 0.05)
        assert "2 other session(s)' jobs" in leads[K].source
    assert shared_device_leads(warmups, max_sessions=1)[4].lead == choose_lead(
        LIVE, [warmups[4]]).lead
    # another schedule: each other session may also overtake the job once (take_next)
    overtaking = shared_device_leads(warmups, max_sessions=3, schedule="replan-first")
    assert overtaking[8].lead == pytest.approx(choose_lead(LIVE, [warmups[8]]).lead + 4 * 0.05)
    assert "two each under replan-first" in overtaking[8].source


def test_a_viewer_flooding_conditions_does_not_stall_an_honest_one_beside_it(tmp_path):
    """A viewer sending conditions at the rate limit keeps a replan on the device at all
    times; the viewer beside it, whose refills queue behind those replans, plays on under
    the server's default lead (one stream's lead let it stall: 0.56 % in issue 34)."""
    from websockets.asyncio.client import connect

    from harness.viewer.client import ClientConfig, run_client
    from latsim.model.traces import Trace

    built = _server(max_sessions=2, out=tmp_path / "server")
    duration = 12.0
    with ServerThread(built) as port:
        flooded = []

        async def flooder() -> None:
            async with connect(f"ws://127.0.0.1:{port}") as ws:
                await ws.send(json.dumps({"type": "hello", "K": 4, "duration": duration,
                                          "policy": "speculative"}))
                assert json.loads(await ws.recv())["type"] == "ready"

                async def read() -> None:
                    async for message in ws:
                        if isinstance(message, str) and json.loads(message)["type"] == "end":
                            return

                reader = asyncio.create_task(read())
                for cid in range(int((duration - 1) * 19)):  # just under the limit of 20/s
                    await ws.send(json.dumps({"type": "condition", "cid": cid}))
                    flooded.append(cid)
                    await asyncio.sleep(1 / 19)
                await asyncio.wait_for(reader, 30)

        honest = {}

        def viewer() -> None:
            honest.update(run_client(ClientConfig(
                f"ws://127.0.0.1:{port}", Trace("t", (2.5, 6.0, 9.5), duration),
                tmp_path / "honest", policy="speculative")))

        other = threading.Thread(target=viewer)
        other.start()
        asyncio.run(flooder())
        other.join(60)
    assert len(flooded) > 190
    assert honest["status"] == "complete" and honest["n_displayed"] == 3
    # What the server guarantees, in counts (so on any machine): on the FIFO device each of
    # the honest session's jobs waited behind at most one of the flooder's
    tasks = list(csv.DictReader((tmp_path / "server" / DEVICE_TASKS).open()))
    by_session: dict[str, list[dict]] = {}
    for task in tasks:
        by_session.setdefault(task["session"], []).append(
            {k: float(task[k]) for k in ("t_enqueue", "t_start", "t_end")})
    flood, calm = sorted(by_session.values(), key=len, reverse=True)
    assert len(flood) > 5 * len(calm)  # the flood kept the device busy
    for job in calm:
        ahead = [f for f in flood if job["t_enqueue"] < f["t_start"] < job["t_start"]]
        assert len(ahead) <= 1, (job, ahead)
    # So a job was at most two jobs' time late, which the default lead budgets (one
    # stream's lead plus the warm-up's p99 of the other's job: at least twice a job's
    # p99): within the stall it aims at (0.1 %; one stream's lead gave 0.56 %, issue 34).
    # Only a machine that ran a job past half the lead (a loaded one: 3.2 % was seen once,
    # the suite running beside two more busy processes on two cores) can stall it, and
    # then not because of the flood
    lead = built.leads[4].lead
    overran = [t for t in tasks if float(t["t_end"]) - float(t["t_start"]) > lead / 2]
    assert honest["stall_pct"] < 100 * AUTO_STALL or overran, honest["stall_pct"]
