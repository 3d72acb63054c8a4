"""Browser sessions for ``results/browser/``: the browser viewer in headless Chromium, each
session on a server of its own, as ``tests/test_browser.py`` runs it.

Run: ``.venv/bin/python bench/record_browser.py [--sessions 4] [--playout-delay 0.1]
[--max-sessions 1] [--out results/browser/runs]``, then ``latsim compare
results/browser/runs --out results/browser``.

Each session: ``latsim serve``'s server in this process (the ``sleep`` generator at a fixed
50 ms a job, K = 4, 16 fps, 2 warm-up jobs, ``--max-sessions``: 1 leaves the session's lead
without a wait budget for other sessions), one page that replays the test's 11 conditions
over 10 s (K = 4, speculative, D = ``--playout-delay``), and its run folder written as the
page offered it to ``OUT/b<i>``. Every session is kept, in the order it ran: none is chosen.
Needs ``/usr/bin/chromium``, ``/usr/bin/chromedriver`` and selenium (the test extra). A new
recording differs run to run (each session has its own refresh phase).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from harness.serve.config import ServerConfig
from harness.serve.server import ServerThread, StreamServer
from harness.tools import browser
from latsim.plugins import GeneratorConfig

#: tests/test_browser.py's trace, duration and token
TRACE = tuple(round(0.6 + 0.83 * i, 2) for i in range(11))
DURATION = 10.0
TOKEN = "browser-test-token"


def record(run_dir: Path, playout_delay: float, max_sessions: int) -> Path:
    """One session on a fresh server; its run folder at ``run_dir``."""
    server = StreamServer(ServerConfig(GeneratorConfig(cost="fixed:0.05"),
                                       generator_name="sleep", Ks=(4,), port=0, warmup=2,
                                       token=TOKEN, max_sessions=max_sessions))
    server.prepare()
    with ServerThread(server) as port:
        session = browser.replay(browser.chromium_driver(), port, TOKEN, TRACE, DURATION,
                                 playout_delay)
    if session.state != "complete":
        raise RuntimeError(f"{run_dir.name}: the session ended {session.state!r}: "
                           f"{session.summary}")
    return session.write(run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--playout-delay", type=float, default=0.1)
    parser.add_argument("--max-sessions", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/browser/runs"))
    args = parser.parse_args(argv)
    reason = browser.missing()
    if reason is not None:
        print(f"record_browser: {reason}", file=sys.stderr)
        return 2
    for i in range(1, args.sessions + 1):
        run_dir = args.out / f"b{i}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        record(run_dir, args.playout_delay, args.max_sessions)
        print(f"wrote {run_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
