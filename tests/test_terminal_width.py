"""Every ``latsim`` command, run for real on an 80-column pseudo-terminal, prints no line
wider than 80 columns and nothing cut to "…".

The CLI tests elsewhere (``test_cli.py``, ``test_tables.py``) draw help and tables through
typer's ``CliRunner``, which is not a terminal: rich and the status lines take their
terminal-only paths (progress bars, ``\\r`` rewrites, colour) only here. The commands run
one after another in one driver process on the pty (a fresh interpreter per command would
cost an import of latsim each), with the window set to 80 columns by ``TIOCSWINSZ``,
``TERM=xterm`` and no ``COLUMNS``: what a user's terminal gives. Every line of the output,
after removing ANSI escapes and splitting at ``\\r`` and ``\\n``, is checked; the driver
marks where each command starts so a failure names it.

Each command runs in its cheapest valid form: short windows, one or two seeds, two 30 s
traces per set generated in the test (``--traces``), small TOML files, ``--out`` under
``tmp_path``. The simulated commands take a few seconds together (the fast tier). Under
``slow``: the live commands, which wait on real time (``profile``, ``measure`` and ``serve``
with the ``sleep`` generator, no torch; ``serve`` runs for real in a process of its own on
a second pty, as in a terminal of its own, ``client`` plays a 2 s session against it, and
the server is then stopped with SIGINT, as a user's Ctrl-C would) and the reproductions
(about 10 s). ``reproduce fleet`` is left out: its fleets are fixed by the paper's
questions (40 s under the suite's load, the CI's ten minutes have no room for it), and
it writes its lines through the same ``formatting.fit`` as the other reproductions.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 80
#: Where the driver says which command starts, and how the one before it ended.
MARK = "@@latsim-pty@@"

#: Runs each step on the pty: ``{"argv": [...]}`` through latsim's console entry point, or
#: ``{"serve": [...], "client": [...]}``: a server in a process of its own and a client
#: in this one, then Ctrl-C to the server.
DRIVER = r"""
import json, os, signal, socket, subprocess, sys, time
from latsim.cli import main

MARK, STEPS, SERVER_TERMINAL = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])

def latsim(argv):
    sys.argv = ["latsim", *argv]
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

def serve_and_client(serve, client):
    port = str(free_port())
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from latsim.cli import main; "
         "sys.argv[0] = 'latsim'; main()", *serve, "--port", port],
        stdin=SERVER_TERMINAL, stdout=SERVER_TERMINAL, stderr=SERVER_TERMINAL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    code = latsim(["client", f"ws://127.0.0.1:{port}", *client])
    server.send_signal(signal.SIGINT)
    served = server.wait(timeout=60)
    return code or served

for step in STEPS:
    print(MARK, "start", " ".join(step.get("argv") or step["serve"]), flush=True)
    started = time.monotonic()
    if "serve" in step:
        code = serve_and_client(step["serve"], step["client"])
    else:
        code = latsim(step["argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    print(MARK, "exit", code, f"{time.monotonic() - started:.2f}", flush=True)
"""

#: CSI and OSC escapes, and the lone two-character ones (``ESC 7``, ``ESC =``, ...).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def _pty() -> tuple[int, int]:
    """(master, slave) of a new pseudo-terminal :data:`COLUMNS` wide."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    return master, slave


def run_on_pty(steps: list[dict], cwd: Path, timeout: float = 300) -> tuple[str, str]:
    """What the driver printed running ``steps`` on an 80-column pty, and what a server it
    started printed on a second one."""
    (master, slave), (server_master, server_slave) = _pty(), _pty()
    env = {key: value for key, value in os.environ.items()
           if key not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                          "TTY_INTERACTIVE", "TERMINAL_WIDTH", "LATSIM_QUIET", "CI",
                          "GITHUB_ACTIONS", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST")}
    env.update(TERM="xterm", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    read: dict[int, list[bytes]] = {master: [], server_master: []}
    with subprocess.Popen([sys.executable, "-c", DRIVER, MARK, json.dumps(steps),
                           str(server_slave)], pass_fds=(server_slave,),
                          stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                          start_new_session=True) as proc:
        os.close(slave)
        os.close(server_slave)
        open_fds = set(read)
        deadline = time.monotonic() + timeout
        try:
            while open_fds and time.monotonic() < deadline:
                for fd in select.select(list(open_fds), [], [], 1.0)[0]:
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:  # EIO: every writer has closed the pty
                        chunk = b""
                    if chunk:
                        read[fd].append(chunk)
                    else:
                        open_fds.discard(fd)
            if open_fds:
                proc.kill()
                pytest.fail("the commands did not finish in time:\n"
                            + b"".join(read[master]).decode(errors="replace")[-3000:])
        finally:
            os.close(master)
            os.close(server_master)
            proc.wait(timeout=60)
    return tuple(b"".join(read[fd]).decode("utf-8", errors="replace")  # type: ignore
                 for fd in (master, server_master))


def wide_lines(text: str, command: str = "?") -> tuple[list[str], dict[str, int]]:
    """The lines wider than :data:`COLUMNS` or holding "…" (each prefixed with the command
    that printed it, ``command`` before the first mark), and each command's exit status."""
    bad, codes = [], {}
    for line in re.split(r"[\r\n]", _ANSI.sub("", text)):
        if line.startswith(MARK):
            _, what, rest = line.split(" ", 2)
            if what == "start":
                command = rest
            else:
                codes[command] = int(rest.split()[0])
            continue
        if len(line) > COLUMNS or "…" in line:
            bad.append(f"{command}: ({len(line)}) {line}")
    return bad, codes


PLAN = """
[workload]
arrivals = "poisson:0.05"
duration = "exponential:80"
updates = "poisson:0.1"

[node]
cost = "usp:usp.json"
r = 4
fps = 16
pools = "dit=2"
cold_start = true

[fleet]
usd_per_gpu_hour = 2.0

[run]
duration = 120
seeds = 1
mode = "sharded"

[search]
K = [2, 4]
policies = ["baseline", "speculative"]
usp = [1, 2]
gpus_per_node = [2]
max_sessions = 6

[slo]
l95 = 2.5
stall_pct = 0.5
ttfc_p95 = 3.0
blocking = 0.05
"""

GRID = """
name = "tiny"
seeds = 1
seed = 7
metrics = ["L50", "L95", "stall_pct"]

[fixed]
duration = 20

[axes]
K = [4, 8]
policy = ["baseline", "speculative"]
"""


def _files(tmp_path: Path) -> None:
    """The small input files the commands read."""
    fleet = (ROOT / "examples" / "fleet.toml").read_text()
    (tmp_path / "fleet.toml").write_text(
        fleet.replace("duration = 1800", "duration = 300").replace("seeds = 2", "seeds = 1"))
    (tmp_path / "usp.json").write_text(json.dumps(
        {"degrees": {"1": {"2": 0.35, "4": 0.7}, "2": {"2": 0.2, "4": 0.38}}}))
    (tmp_path / "plan.toml").write_text(PLAN)
    (tmp_path / "grid.toml").write_text(GRID)


def _traces() -> list[dict]:
    return [{"argv": ["traces", "generate", "--kind", kind, "--count", "2", "--duration",
                      "30", "--out", f"traces/{kind}"]} for kind in ("low", "high")]


QUICK = [
    {"argv": ["-h"]},
    {"argv": ["--version"]},
    *_traces(),
    {"argv": ["traces", "validate", "traces/high"]},
    {"argv": ["traces", "show", "traces/high/high_000.jsonl"]},
    {"argv": ["theory", "--K", "21", "--C", "1.6", "--rate", "0.1"]},
    {"argv": ["plugins"]},
    {"argv": ["controller"]},
    {"argv": ["controller", "--diagram"]},
    {"argv": ["help", "traces", "generate"]},
    {"argv": ["fleet", "-h"]},
    {"argv": ["simulate", "--K", "8", "--C", "0.5", "--duration", "20", "--seeds", "1",
              "--out", "runs/k8"]},
    {"argv": ["sweep", "--K", "4", "8", "--duration", "20", "--seeds", "2"]},
    {"argv": ["capacity", "--K", "8", "--C", "0.5", "--pools", "dit=1", "--slo-l95", "2.0",
              "--slo-stall", "5", "--duration", "20", "--max-streams", "2",
              "--min-seeds", "2", "--max-seeds", "2"]},
    {"argv": ["grid", "grid.toml", "--out", "grid"]},
    {"argv": ["compare", str(ROOT / "results" / "compare" / "runs" / "K4-speculative"),
              "--replications", "1", "--out", "compare"]},
    {"argv": ["plot", "timeline", "runs/k8", "--out", "timeline.png"]},
    {"argv": ["export", "perfetto", "runs/k8", "--out", "trace.json"]},
    {"argv": ["fleet", "fleet.toml", "--out", "fleet"]},
    {"argv": ["fleet", "run", "fleet.toml", "--nodes", "2", "--json"]},
    {"argv": ["fleet", "plan", "fleet.toml", "--slo-l95", "2.0", "--slo-stall", "1",
              "--max-nodes", "2"]},
    {"argv": ["plan", "plan.toml", "--out", "plan"]},
    {"argv": ["reproduce", "replan-rule", "--traces", "traces", "--out", "rule"]},
]

#: The live commands: real time passes (a 2 s window each, warm-ups), little work.
LIVE = [
    {"argv": ["profile", "--generator", "sleep", "--cost", "fixed:0.01", "--K", "2",
              "--jobs", "2", "--gap", "0", "--out", "profile.json"]},
    {"argv": ["measure", "--generator", "sleep", "--cost", "fixed:0.02", "--K", "4",
              "--policy", "baseline", "--rate", "1", "--duration", "2", "--warmup", "2",
              "--calibrate", "0", "--out", "measure"]},
    {"serve": ["serve", "--generator", "sleep", "--cost", "fixed:0.02", "--K", "4",
               "--warmup", "2"],
     "client": ["--K", "4", "--rate", "1", "--duration", "2", "--out", "viewer"]},
]

#: The paper's reproductions on two 30 s traces per set: a few seconds each.
REPRODUCE = [
    *_traces(),
    {"argv": ["reproduce", "--traces", "traces", "--out", "paper"]},
    {"argv": ["reproduce", "serving", "--traces", "traces", "--out", "serving"]},
    {"argv": ["reproduce", "systems", "--traces", "traces", "--out", "systems"]},
]

def _check(steps: list[dict], tmp_path: Path) -> None:
    _files(tmp_path)
    text, served = run_on_pty(steps, tmp_path)
    bad, codes = wide_lines(text)
    bad += wide_lines(served, "serve")[0]
    failed = {command: code for command, code in codes.items() if code != 0}
    assert len(codes) == len(steps), text[-3000:]
    assert not failed, (failed, text[-3000:])
    assert not bad, "\n".join(bad)


def test_every_quick_command_fits_80_columns_on_a_terminal(tmp_path):
    _check(QUICK, tmp_path)


@pytest.mark.slow
def test_the_live_commands_fit_80_columns_on_a_terminal(tmp_path):
    """``measure``'s status line sat beside its bar cut to "…"; ``serve``'s lead, address
    and log lines and ``client``'s summary were one long line each (up to 211 columns)."""
    _check(LIVE, tmp_path)


@pytest.mark.slow
def test_the_reproductions_fit_80_columns_on_a_terminal(tmp_path):
    _check(REPRODUCE, tmp_path)

