"""The live server on a GPU: two viewers of one ``latsim serve`` at once, then their
comparison with the serving model. Writes ``<out>/gpu_serve.json`` and the client run
folders ``<out>/{speculative,baseline}``.

    python bench/gpu_serve.py --out DIR [--preset wan-1.3b --resolution 480p --device cuda]
                              [--K 3 --steps 4 --duration 20 --delay 0.02 --jitter 0.005]

The server runs in its own process (as ``latsim serve`` would, ``--port 0``); the viewers
are :func:`harness.viewer.client.run_client` in two threads, one speculative and one baseline, each
with a deterministic trace of conditions every 1.2-1.9 s. On a CPU with ``--preset tiny
--resolution tiny --device cpu`` it is the same check, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.net.netclock import Shaper
from harness.viewer.client import ClientConfig, run_client
from latsim.analysis.viewer_compare import compare_client_runs
from latsim.model.traces import Trace


def _trace(seed: int, duration: float) -> Trace:
    times, t = [], 1.0 + 0.13 * seed
    while t < duration - 1.0:
        times.append(round(t, 4))
        t += 1.2 + 0.17 * ((len(times) * 7 + seed) % 5)
    return Trace(f"gpu-serve-{seed}", tuple(times), duration)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="wan-1.3b")
    parser.add_argument("--resolution", default="480p")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--K", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--jitter", type=float, default=0.005)
    parser.add_argument("--playout-delay", type=float, default=0.1)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-c", "from harness.cli import commands; commands()", "serve",
         "--preset", args.preset, "--resolution", args.resolution, "--device", args.device,
         "--K", str(args.K), "--steps", str(args.steps), "--port", "0", "--warmup", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert server.stdout is not None
    log, port = [], None
    while port is None:
        line = server.stdout.readline()
        if not line:
            print("".join(log), file=sys.stderr)
            return 1
        log.append(line)
        print(line, end="", flush=True)
        found = re.search(r"ws://[\d.]+:(\d+)", line)
        port = int(found.group(1)) if found else None
    threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
    started = time.perf_counter() - t_start
    summaries: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def viewer(policy: str, seed: int) -> None:
        try:
            summaries[policy] = run_client(ClientConfig(
                f"ws://127.0.0.1:{port}", _trace(seed, args.duration), args.out / policy,
                K=args.K, policy=policy, playout_delay=args.playout_delay,
                uplink=Shaper(args.delay, args.jitter), seed=seed))
        except Exception as exc:  # noqa: BLE001 - reported in the JSON
            errors[policy] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=viewer, args=(p, s))
               for p, s in (("speculative", 1), ("baseline", 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.terminate()
    server.wait(60)
    rows = {}
    try:  # the viewers of one server, predicted together on its one device
        names = sorted(summaries)
        rows = dict(zip(names, compare_client_runs([args.out / n for n in names]).rows,
                        strict=True))
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        errors["compare"] = f"{type(exc).__name__}: {exc}"
    keep = ("status", "n_conditions", "n_displayed", "L50", "L95", "viewer_stall_pct",
            "client_stall_pct", "C_mean", "uplink_mean", "deliver_mean", "offset",
            "offset_uncertainty", "drift", "display_lateness95", "bytes_received", "n_slots")
    report = {"args": {k: str(v) for k, v in vars(args).items()},
              "server_start_s": started, "server_log": "".join(log)[-4000:],
              "viewers": {p: {k: s.get(k) for k in keep} for p, s in summaries.items()},
              "compare": rows, "errors": errors}
    (args.out / "gpu_serve.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    for policy, row in rows.items():
        s = summaries[policy]
        print(f"{policy:>11}: L50 {row['L50_measured']:.3f}/{row['L50_predicted']:.3f} "
              f"({row['L50_err_pct']:+.1f}%) L95 {row['L95_measured']:.3f}/"
              f"{row['L95_predicted']:.3f} ({row['L95_err_pct']:+.1f}%) viewer stall "
              f"{row['viewer_stall_pct_measured']:.2f}/{row['viewer_stall_pct_predicted']:.2f}"
              f" C {s['C_mean']:.3f} s, {s['bytes_received'] / 1e6:.1f} MB")
    print("errors:", errors or "none")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
