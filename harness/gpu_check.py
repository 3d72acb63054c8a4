"""The GPU check: one script a lent GPU (an H200) finishes in under 8 minutes.

    python -m harness.gpu_check [--out DIR] [--duration 60] [--short-K 3] [--long-K 21]

1. Per-forward time of ``wan-1.3b`` at 480p (bf16, SDPA) for K in {1, 3, 7, 21}: one
   transformer forward on K noisy latents, CUDA-event timed, median of ``--reps`` (>= 20)
   after warm-up; analytic FLOPs (:func:`harness.presets.forward_flops`) and achieved
   TFLOP/s per K, beside the paper's H200 reference (K=1: 77.5 ms; K=3: 2.05x that).
2. A ``--duration``-second live run per policy at a short and a long K
   (:func:`harness.run.measure`, Poisson conditions at 0.1/s, seeded).
3. A printed table, and everything as JSON in ``<out>/gpu_check.json`` (run folders under
   ``<out>/live``).

Without CUDA it exits with status 2 and one line on stderr. :func:`forward_rows` and
:func:`format_table` are plain functions, tested on CPU with the tiny preset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.presets import ModelPreset, Resolution, forward_flops, model_preset, resolution
from latsim.errors import LatsimError
from latsim.run.files import clean

#: The paper's single-H200 per-forward times of Wan at 480p (ms), by K.
PAPER_H200_MS: dict[int, float] = {1: 77.5, 3: 77.5 * 2.05}

DEFAULT_KS = (1, 3, 7, 21)


@dataclass(frozen=True)
class ForwardRow:
    """Per-forward timing of one K."""

    K: int
    tokens: int
    reps: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    gflop: float  # per forward
    tflops: float  # achieved, at the median
    paper_ms: float | None
    ratio_to_paper: float | None  # ours / paper


def make_row(preset: ModelPreset, res: Resolution, K: int,  # noqa: N803
             times_ms: list[float]) -> ForwardRow:
    """Reduce per-forward times (ms) of one K to a table row."""
    if not times_ms:
        raise ValueError("no timings")
    ordered = sorted(times_ms)
    median = statistics.median(ordered)
    flops = forward_flops(preset, res, K)
    paper = PAPER_H200_MS.get(K)
    return ForwardRow(
        K=K, tokens=K * res.tokens_per_frame(preset), reps=len(ordered), median_ms=median,
        p10_ms=ordered[int(0.1 * (len(ordered) - 1))],
        p90_ms=ordered[int(round(0.9 * (len(ordered) - 1)))],
        gflop=flops / 1e9, tflops=flops / (median / 1e3) / 1e12 if median > 0 else 0.0,
        paper_ms=paper, ratio_to_paper=median / paper if paper else None,
    )


def time_forwards(generator, K: int, reps: int = 20, warmup: int = 3) -> list[float]:  # noqa: N803
    """Per-forward times (ms) of ``generator.model`` on ``K`` noisy latents."""
    torch = generator._torch
    cuda = generator.device.type == "cuda"
    x = generator._randn(generator.latent_shape(K), 1234 + K)
    ehs = generator.embedding(1)
    t = torch.tensor([500.0], device=generator.device)
    times = []
    with torch.inference_mode():
        for i in range(warmup + reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                generator.model(x, t, ehs, return_dict=False)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                generator.model(x, t, ehs, return_dict=False)
                elapsed = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(elapsed)
    return times


def forward_rows(generator, Ks: tuple[int, ...], reps: int = 20,  # noqa: N803
                 warmup: int = 3) -> list[ForwardRow]:
    """Time every K and build the rows (works on CPU too, for tests)."""
    rows = []
    for K in Ks:  # noqa: N806
        generator.check_fits(K)
        rows.append(make_row(generator.preset, generator.res, K,
                             time_forwards(generator, K, reps, warmup)))
    return rows


def format_table(rows: list[ForwardRow], device: str) -> str:
    """The per-forward table, with the paper's H200 reference beside ours."""
    lines = [
        f"per-forward time, one transformer forward on K latents ({device})",
        f"{'K':>3} {'tokens':>7} {'median ms':>10} {'p10':>8} {'p90':>8} {'GFLOP':>9} "
        f"{'TFLOP/s':>8} {'paper H200 ms':>14} {'ours/paper':>10}",
    ]
    for r in rows:
        paper = f"{r.paper_ms:.1f}" if r.paper_ms is not None else "–"
        ratio = f"{r.ratio_to_paper:.2f}" if r.ratio_to_paper is not None else "–"
        lines.append(
            f"{r.K:>3} {r.tokens:>7} {r.median_ms:>10.2f} {r.p10_ms:>8.2f} {r.p90_ms:>8.2f} "
            f"{r.gflop:>9.1f} {r.tflops:>8.1f} {paper:>14} {ratio:>10}"
        )
    by_k = {r.K: r for r in rows}
    if 1 in by_k and 3 in by_k:
        lines.append(f"K=3 / K=1: ours {by_k[3].median_ms / by_k[1].median_ms:.2f}x, "
                     "paper 2.05x")
    return "\n".join(lines)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check"))
    parser.add_argument("--preset", default="wan-1.3b")
    parser.add_argument("--resolution", default="480p")
    parser.add_argument("--Ks", type=int, nargs="+", default=list(DEFAULT_KS))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--duration", type=float, default=60.0, help="live run length (s)")
    parser.add_argument("--short-K", type=int, default=3)
    parser.add_argument("--long-K", type=int, default=21)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--decode", action="store_true", help="VAE decode inside C")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    args = _args(argv)
    started = time.perf_counter()
    try:
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            raise LatsimError(
                f"CUDA is not available (torch {torch.__version__}, CUDA build "
                f"{torch.version.cuda or 'none'}): run this on a GPU machine"
            )
        if args.reps < 20 and args.device == "cuda":
            raise LatsimError("--reps must be >= 20")
        from harness.generator import GeneratorConfig, WanGenerator, device_name
        from harness.measured import versions
        from harness.run import MeasureConfig, measure
        from latsim.formatting import StatusLine

        preset, res = model_preset(args.preset), resolution(args.resolution)
        if args.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
        generator = WanGenerator(GeneratorConfig(args.preset, args.resolution, args.steps,
                                                 0, args.decode, args.device))
        rows = forward_rows(generator, tuple(args.Ks), args.reps)
        table = format_table(rows, device_name(args.device))
        print(table, flush=True)
        live = []
        if not args.skip_live:
            config = MeasureConfig(
                preset=args.preset, resolution=args.resolution,
                Ks=(args.short_K, args.long_K), steps=args.steps,
                policies=("baseline", "speculative"), duration=args.duration,
                device=args.device, out=str(args.out / "live"), decode=args.decode,
                warmup_timed=10, drain=10.0,
            )
            with StatusLine() as status:
                results = measure(config, progress=status, generator=generator)
            live = [r.summary for r in results]
            print(f"\nlive runs ({args.duration:g} s each, {res.name}, steps={args.steps})")
            for s in live:
                print(f"  {s['policy']:>11} K={s['K']:>2} C={s['C_mean']:.3f}s "
                      f"lead={s['lead']:.3f}s L50={_f(s['L50'])} L95={_f(s['L95'])} "
                      f"stall={s['stall_pct']:.2f}% busy={s['busy_pct']:.1f}% "
                      f"kernel={_f(s['kernel_activity'], 1)}%")
        payload = {
            "device": device_name(args.device), "preset": preset.name,
            "resolution": asdict(res), "versions": versions(),
            "forward": [asdict(r) for r in rows], "paper_h200_ms": PAPER_H200_MS,
            "table": table, "live": live, "elapsed_s": time.perf_counter() - started,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(clean(payload), indent=2) + "\n")
        print(f"\nwrote {args.out / 'gpu_check.json'} in {payload['elapsed_s']:.0f} s")
        return 0
    except LatsimError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
