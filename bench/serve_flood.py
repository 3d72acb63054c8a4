"""Flooders beside an honest viewer (issue 51): what seven sessions sending conditions as
fast as they can cost one viewer that sends them as a person would.

Run: ``.venv/bin/python bench/serve_flood.py [--rates 0 20 2000] [--flooders 7]
[--duration 30] [--repeats 2] [--out results/serve/flood]`` (about 40 s a server run).

Each run starts a fresh ``latsim serve --generator sleep --cost fixed:0.02 --K 4`` with its
defaults otherwise (``--max-sessions 8``, ``--max-condition-rate 20``, the default lead,
which budgets one job of each other session). ``--flooders`` sessions connect first and
send conditions at each rate of ``--rates`` per second (0: none; they are then ordinary
quiet sessions) from their ``ready`` until the honest viewer's session ends; then the
honest viewer (:func:`bench_serve_load._viewer`: 16 fps, speculative, the server's lead)
connects and sends a condition every 2 s. Measured per run: whether the honest viewer got
a session, its stall (the server's, and the viewer's at a playout delay of 0.1 s) and L50
over its window; the flooders' conditions sent, acknowledged and refused; the server's
CPU per wall second and its log lines.

The machine is shared by the server and this process (every viewer): ``flood.json``
records its load. Writes ``flood.json`` under ``--out`` and prints a table. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

from bench_serve_load import Server, Viewer, _viewer, _viewer_stats  # this folder

#: A job's time: eight sessions' refills (K = 4 at 16 fps, a chunk each 0.25 s) load the
#: device to 0.64, and seven sessions' replans at the condition limit (20/s) would ask
#: for 2.8 times the device if every condition became a job
COST = "fixed:0.02"
HONEST_EVERY_S = 2.0
PLAYOUT_DELAY_S = 0.1


async def _flooder(url: str, rate: float, duration: float, stop: asyncio.Event,
                   counts: dict[str, int]) -> None:
    """One session sending ``rate`` conditions a second (in bursts every 10 ms) until
    ``stop``; counts what it sent and what came back."""
    from websockets.asyncio.client import connect

    from harness.net.wire import FROM_SERVER, Ack, Condition, Error, Hello, Ready, parse_message

    async with connect(url, max_size=1 << 26, compression=None, open_timeout=60) as ws:
        await ws.send(Hello(K=4, duration=duration, policy="speculative").to_json())
        session = None

        async def read() -> None:
            nonlocal session
            async for raw in ws:
                if isinstance(raw, bytes):
                    continue
                message = parse_message(raw, FROM_SERVER)
                if isinstance(message, Ready):
                    session = message.session
                elif isinstance(message, Ack):
                    counts["acked"] += 1
                elif isinstance(message, Error):
                    counts["refused"] += 1

        reader = asyncio.create_task(read())
        while session is None and not reader.done():
            await asyncio.sleep(0.01)
        counts["sessions"] += session is not None
        cid = 0
        burst = max(1, round(rate / 100))
        try:
            while rate > 0 and session is not None and not stop.is_set():
                for _ in range(burst):
                    await ws.send(Condition(cid, time.perf_counter(), session).to_json())
                    cid += 1
                counts["sent"] += burst
                await asyncio.sleep(burst / rate)
            await stop.wait()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


async def _scene(server: Server, flooders: int, rate: float, duration: float
                 ) -> tuple[Viewer, dict]:
    url = f"ws://127.0.0.1:{server.port}"
    stop = asyncio.Event()
    counts = {"sessions": 0, "sent": 0, "acked": 0, "refused": 0}
    floods = [asyncio.create_task(_flooder(url, rate, duration + 30, stop, counts))
              for _ in range(flooders)]
    await asyncio.sleep(2.0)  # the flooders are in first
    honest = Viewer(0)
    times = [HONEST_EVERY_S * (n + 1) for n in range(int(duration / HONEST_EVERY_S) - 2)]
    cpu0, wall0 = server.cpu_seconds(), time.perf_counter()
    try:
        await asyncio.wait_for(_viewer(url, honest, 0.0, duration, times, None),
                               duration + 60)
    except Exception as exc:  # noqa: BLE001 - reported as the viewer's status
        honest.status = f"client: {type(exc).__name__}: {exc}"[:200]
    cpu = (server.cpu_seconds() - cpu0) / (time.perf_counter() - wall0)
    stop.set()
    await asyncio.gather(*floods, return_exceptions=True)
    return honest, {**counts, "server_cpu": cpu}


def one_run(cost: str, flooders: int, rate: float, duration: float, repeat: int
            ) -> dict:
    with tempfile.TemporaryDirectory() as log_dir:
        server = Server(cost, 64, Path(log_dir), args=())
        try:
            honest, counts = asyncio.run(_scene(server, flooders, rate, duration))
        finally:
            rc = server.stop()
            log_lines = len(server.log_path.read_text().splitlines())
    stats = _viewer_stats(honest, duration, PLAYOUT_DELAY_S)
    return {"flooders": flooders, "rate": rate, "repeat": repeat, "server_rc": rc,
            "log_lines": log_lines, **counts, **{f"honest_{k}": v for k, v in stats.items()}}


def table(rows: list[dict]) -> str:
    head = (f"{'rate/s':>7} {'rep':>3} {'honest':>9} {'stall %':>8} {'viewer %':>8} "
            f"{'L50 s':>6} {'sent':>8} {'acked':>6} {'refused':>7} {'cpu':>5} {'log':>4}")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['rate']:>7g} {r['repeat']:>3} {str(r['honest_status'])[:9]:>9} "
            f"{r.get('honest_server_stall_pct', math.nan):>8.3f} "
            f"{r.get('honest_viewer_stall_pct', math.nan):>8.3f} "
            f"{r.get('honest_L50_s', math.nan):>6.3f} {r['sent']:>8} {r['acked']:>6} "
            f"{r['refused']:>7} {r['server_cpu']:>5.2f} {r['log_lines']:>4}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 20.0, 2000.0])
    parser.add_argument("--flooders", type=int, default=7)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cost", default=COST, help="the sleep generator's job time")
    parser.add_argument("--out", type=Path, default=Path("results/serve/flood"))
    options = parser.parse_args()
    rows = []
    for repeat in range(options.repeats):  # interleaved: the machine's load spreads
        for rate in options.rates:
            rows.append(one_run(options.cost, options.flooders, rate, options.duration,
                                repeat))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    options.out.mkdir(parents=True, exist_ok=True)
    setup = {"cost": options.cost, "K": 4, "flooders": options.flooders,
             "duration_s": options.duration, "honest_every_s": HONEST_EVERY_S,
             "playout_delay_s": PLAYOUT_DELAY_S, "date": date.today().isoformat(),
             "revision": revision, "machine": platform.node(), "cores": os.cpu_count(),
             "load_1min_after": os.getloadavg()[0]}
    (options.out / "flood.json").write_text(json.dumps({"setup": setup, "runs": rows},
                                                       indent=1, default=str) + "\n")
    print(f"wrote {options.out / 'flood.json'}")


if __name__ == "__main__":
    main()
