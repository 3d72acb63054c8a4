"""Examples shown at the end of each command's ``--help`` (one or two per command).

Plain text, no imports: the command line attaches them when it registers its commands
(and the live harness's, which join it as a plugin)."""

from __future__ import annotations

#: Command path (``traces generate``) -> examples, one per line.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "simulate": ("latsim simulate --K 8 --C 0.5 --json",
                 "latsim simulate --K 8 --C 0.5 --streams 4 --pools dit=1 "
                 "--schedule least-slack"),
    "sweep": ("latsim sweep --K 4 8 21",
              "latsim sweep --K 4 8 --cost table:profile.json --out runs/"),
    "theory": ("latsim theory --K 21 --C 1.6 --rate 0.1",),
    "capacity": ("latsim capacity --K 8 --C 0.5 --pools dit=1 --slo-l95 2.0 "
                 "--slo-stall 0.1",),
    "compare": ("latsim compare results/compare/runs",),
    "grid": ("latsim grid EXPERIMENT.toml --out grid/ --scheduler dask-local",),
    # command groups: what their commands do, in one line each
    "fleet": ("latsim fleet examples/fleet.toml --out fleet/",
              "latsim fleet plan examples/fleet.toml --slo-l95 2.0 --slo-stall 1"),
    "traces": ("latsim traces generate --kind high --out traces/high",
               "latsim traces show traces/high/high_000.jsonl"),
    "plot": ("latsim plot timeline runs/k8 --policy speculative",),
    "export": ("latsim export perfetto runs/k8 --out trace.json",),
    "fleet run": ("latsim fleet run examples/fleet.toml --out fleet/",
                  "latsim fleet examples/fleet.toml --nodes 2 --placement round-robin --json"),
    "fleet plan": ("latsim fleet plan examples/fleet.toml --slo-l95 2.0 --slo-stall 1 "
                   "--slo-ttfc 5",),
    "plan": ("latsim plan examples/plan.toml --out plan/",
             "latsim plan examples/plan.toml --seeds 2 --json"),
    "plugins": ("latsim plugins", "latsim plugins generators --json"),
    "controller": ("latsim controller --diagram",),
    "help": ("latsim help sweep", "latsim help traces generate"),
    "traces generate": ("latsim traces generate --kind high --out traces/high",),
    "traces validate": ("latsim traces validate traces/high",),
    "traces show": ("latsim traces show traces/high/high_000.jsonl",),
    "reproduce": ("latsim reproduce", "latsim reproduce serving --jobs 2"),
    "reproduce serving": ("latsim reproduce serving",),
    "reproduce systems": ("latsim reproduce systems",),
    "reproduce fleet": ("latsim reproduce fleet --jobs 2",),
    "reproduce replan-rule": ("latsim reproduce replan-rule",
                              "latsim reproduce replan-rule --json --out /tmp/rule"),
    "plot timeline": ("latsim simulate --K 8 --C 0.5 --out runs/k8",
                      "latsim plot timeline runs/k8 --policy speculative --t0 10 --t1 30"),
    "export perfetto": ("latsim export perfetto runs/k8 --out trace.json",),
    "measure": ("latsim measure --K 2 4 --rate 0.2 --duration 30 --out runs/",
                "latsim measure --generator sleep --cost lognormal:0.2,0.3 --K 4 --out runs/"),
    "profile": ("latsim profile --K 2 4 8 --out profile.json",),
    "serve": ("latsim serve --K 4 --port 8765",
              "latsim serve --generator sleep --cost fixed:0.15 --K 4"),
    "client": ("latsim client ws://127.0.0.1:8765 --K 4 --duration 30 --out viewer/",),
}


def epilog(path: str) -> str | None:
    """The examples of command ``path`` as a ``--help`` epilog (one paragraph each)."""
    examples = EXAMPLES.get(path)
    if not examples:
        return None
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in examples)
