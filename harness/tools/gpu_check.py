"""The GPU check: one script a lent GPU (an H200) finishes in minutes.

    python -m harness.tools.gpu_check [--out DIR] [--duration 60] [--short-K 3] [--long-K 21]

1. ``forward``: per-forward time of ``wan-1.3b`` at 480p (bf16, SDPA) for K in
   {1, 3, 7, 21}, no context: one transformer forward on K noisy latents, CUDA-event timed,
   median of ``--reps`` (>= 20) after warm-up; analytic FLOPs
   (:func:`harness.generators.presets.forward_flops`) and achieved TFLOP/s per K.
2. ``paper``: the paper's Table 2(a) workload, like for like, at 480p and 720p for K = 1
   and 3 (``--paper-Ks``): a *cached* forward, the K chunk latents attending over a KV cache
   of the clean history, timed as the paper did (median of 30 after 10 warm-ups), with
   the context-free time of the same K beside it. ours/paper is reported only for this
   workload. See :data:`PAPER_CONTEXT` for where the history length comes from.
3. ``live``: a ``--duration``-second live run per policy at a short and a long K
   (:func:`harness.measure.run.measure`, Poisson conditions at 0.1/s, seeded).

``--generator ltx`` (or another registered generator that times its forwards alone,
:class:`latsim.plugins.TimesForwards`) checks that generator instead, at full size
(``ltx-2.3`` at 448p by default): its per-forward medians for K in {1, 3, 9, 15, 45}, the
paper's Table 2(b) K = 45 workload beside the paper's 2016.2 ms (one H200; see
:data:`harness.generators.ltx.PAPER_WORKLOAD`) and the live runs.

Everything goes to ``<out>/gpu_check.json`` (run folders under ``<out>/live``), rewritten
atomically (temp file + rename) as each section starts and ends: a run that is cut short
keeps every finished section, ``sections`` says which are done, running, failed (with the
error under ``errors``) or pending. A failed section does not stop the later ones; the exit
status is 0 if all finished, 1 if one failed, 2 on bad input or without CUDA (one line on
stderr). :func:`forward_rows`, :func:`paper_rows`, :func:`format_table` and
:func:`format_paper_table` are plain functions, tested on CPU with the tiny preset.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.generators.presets import (
    ModelPreset,
    Resolution,
    forward_flops,
    model_preset,
    resolution,
)
from latsim.errors import LatsimError
from latsim.run.folder import write_json

#: Wan2.1's window: 81 frames at 16 fps, r = 4 -> 21 latent frames (the first uncompressed).
WAN_WINDOW_LATENTS = 21

#: The context of the paper's Table 2 forward times. The seeds (000 §3.1, 001) say: Table 2
#: times one DiT forward per K on synthetic inputs ("shape-level", sampler loop, text
#: encoder and VAE excluded; median of the slowest rank over 30 synchronised forwards after
#: 10 warm-ups), LTX's rows are named "cached-forward" (Table 2(b)), the serving keeps the
#: clean prefix's KV ("retained KV", §5), and Wan was evaluated on 81-frame videos (21
#: latents). The history length is not stated; the window-filling history 21 - K is the one
#: that makes the paper's numbers consistent: with it, 480p K=1/K=3 and 720p K=21 (context
#: 0) run at 176, 255 and 194 TFLOP/s; without any context K=1 would run at 60 TFLOP/s.
PAPER_CONTEXT = ("cached forward: the K chunk latents attend over a KV cache of 21 - K clean "
                 "history latents (Wan's 81-frame, 21-latent window)")

#: The paper's single-H200 (USP1) per-forward times of Wan2.1-1.3B (ms), by resolution and K.
PAPER_H200_FORWARD_MS: dict[str, dict[int, float]] = {
    "480p": {1: 77.5, 3: 77.5 * 2.05},
    "720p": {21: 6432.8},
}
#: The paper's K=3 / K=1 forward-time ratios.
PAPER_K3_OVER_K1: dict[str, float] = {"480p": 2.05, "720p": 2.74}
#: The 480p references (kept for callers of the first version).
PAPER_H200_MS: dict[int, float] = PAPER_H200_FORWARD_MS["480p"]

DEFAULT_KS = (1, 3, 7, 21)
PAPER_KS = (1, 3)
PAPER_RESOLUTIONS = ("480p", "720p")
SECTIONS = ("model", "forward", "paper", "live")
#: Full-size defaults (preset, resolution) per generator; ``--preset``/``--resolution``
#: override them.
GENERATOR_DEFAULTS: dict[str, tuple[str, str]] = {"wan": ("wan-1.3b", "480p"),
                                                  "ltx": ("ltx-2.3", "448p")}
#: The paper's LTX reference, Table 2(b): K = 45, one H200 (USP1), ms; the workload is
#: :data:`harness.generators.ltx.PAPER_WORKLOAD` (one clean latent of cached context).
PAPER_LTX_MS: dict[int, float] = {45: 2016.2}
PAPER_LTX_CONTEXT = 1
#: Per-forward K of a generator other than Wan (LTX's trained chunk sizes).
OTHER_KS = (1, 3, 9, 15, 45)
FORMAT = "latsim-gpu-check/2"


def paper_context(K: int) -> int:
    """Clean history latents the paper's forward of ``K`` latents attends over."""
    return max(0, WAN_WINDOW_LATENTS - K)


@dataclass(frozen=True)
class ForwardRow:
    """Per-forward timing of one K (and context, and resolution)."""

    K: int
    tokens: int  # chunk tokens (queries)
    reps: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    gflop: float  # per forward
    tflops: float  # achieved, at the median
    paper_ms: float | None  # the paper's time for this K and resolution (its workload)
    ratio_to_paper: float | None  # ours / paper, only where the workload is the paper's
    resolution: str = ""
    context: int = 0  # cached clean latents attended over
    like_for_like: bool = False  # the paper's workload: context == paper_context(K)


def make_row(preset: ModelPreset, res: Resolution, K: int,
             times_ms: list[float], context: int = 0) -> ForwardRow:
    """Reduce per-forward times (ms) of one K to a table row."""
    if not times_ms:
        raise ValueError("no timings")
    ordered = sorted(times_ms)
    median = statistics.median(ordered)
    flops = forward_flops(preset, res, K, cached_context=context)
    paper = PAPER_H200_FORWARD_MS.get(res.name, {}).get(K)
    like = context == paper_context(K)
    return ForwardRow(
        K=K, tokens=K * res.tokens_per_frame(preset), reps=len(ordered), median_ms=median,
        p10_ms=ordered[int(0.1 * (len(ordered) - 1))],
        p90_ms=ordered[int(round(0.9 * (len(ordered) - 1)))],
        gflop=flops / 1e9, tflops=flops / (median / 1e3) / 1e12 if median > 0 else 0.0,
        paper_ms=paper, ratio_to_paper=median / paper if paper and like else None,
        resolution=res.name, context=context, like_for_like=like,
    )


# ---------------------------------------------------------------- the cached forward


def _rope(x, cos, sin):
    """Wan's rotary embedding on (B, S, H, D) (as diffusers' ``WanAttnProcessor``)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = x.new_empty(x.shape)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class CachedSelfAttention:
    """Self-attention processor of one block: the chunk's tokens attend over a KV cache.

    ``key``/``value`` are (1, n_ctx + n_chunk, heads, head_dim) buffers whose first
    ``n_ctx`` rows hold the cached context; each forward writes the chunk's own keys and
    values into the rest (no copy of the context) and attends over the whole buffer. The
    projections, norms and RoPE are those of diffusers' ``WanAttnProcessor``.
    """

    def __init__(self, torch, key, value, n_ctx: int) -> None:
        self.torch, self.key, self.value, self.n_ctx = torch, key, value, n_ctx

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = _rope(query, *rotary_emb), _rope(key, *rotary_emb)
        self.key[:, self.n_ctx:] = key
        self.value[:, self.n_ctx:] = value
        out = self.torch.nn.functional.scaled_dot_product_attention(
            query.transpose(1, 2), self.key.transpose(1, 2), self.value.transpose(1, 2))
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


@contextlib.contextmanager
def cached_context(generator, res: Resolution, K: int, context: int) -> Iterator[None]:
    """While open, ``generator.model`` on K latents is a cached forward over ``context``
    clean latents before them: every block's self-attention reads a KV cache of the
    context (synthetic values, allocated on the device here, outside any timing) and the
    chunk gets the rotary positions ``context .. context + K - 1``. Restores the model."""
    if context <= 0:
        yield
        return
    torch, model = generator._torch, generator.model
    tpf = res.tokens_per_frame(generator.preset)
    n_ctx, n = context * tpf, (context + K) * tpf
    shape = (1, generator.preset.in_channels, context + K, res.latent_h, res.latent_w)
    cos, sin = model.rope(types.SimpleNamespace(shape=shape))  # reads only the shape
    freqs = (cos[:, n_ctx:], sin[:, n_ctx:])
    heads, head_dim = generator.preset.num_heads, generator.preset.head_dim
    gen = torch.Generator(device=generator.device).manual_seed(4321 + context)
    processors = []
    for _ in model.blocks:
        key, value = (torch.randn((1, n, heads, head_dim), generator=gen,
                                  device=generator.device, dtype=generator.dtype)
                      for _ in range(2))
        processors.append(CachedSelfAttention(torch, key, value, n_ctx))
    originals = [block.attn1.processor for block in model.blocks]
    try:
        for block, processor in zip(model.blocks, processors, strict=True):
            block.attn1.processor = processor
        model.rope.forward = lambda hidden_states: freqs
        yield
    finally:
        for block, processor in zip(model.blocks, originals, strict=True):
            block.attn1.processor = processor
        if model.rope.__dict__.get("forward") is not None:
            del model.rope.forward  # the class's forward again
        processors.clear()


def time_forwards(generator, K: int, reps: int = 20, warmup: int = 3, *,
                  res: Resolution | None = None, context: int = 0) -> list[float]:
    """Per-forward times (ms) of ``generator.model`` on ``K`` noisy latents at ``res`` (the
    generator's by default), over ``context`` cached clean latents. Every input is on the
    device before the first timed forward; CUDA forwards are timed with events."""
    torch = generator._torch
    res = res or generator.res
    cuda = generator.device.type == "cuda"
    shape = (1, generator.preset.in_channels, K, res.latent_h, res.latent_w)
    x = generator._randn(shape, 1234 + K)
    ehs = generator.embedding(1)
    t = torch.tensor([500.0], device=generator.device)
    times = []
    with torch.inference_mode(), cached_context(generator, res, K, context):
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


def forward_rows(generator, Ks: tuple[int, ...], reps: int = 20,
                 warmup: int = 3, *, res: Resolution | None = None,
                 context: int | Callable[[int], int] = 0) -> list[ForwardRow]:
    """Time every K and build the rows (works on CPU too, for tests). ``context`` is a
    number of cached latents, or a function of K (:func:`paper_context`)."""
    res = res or generator.res
    rows = []
    for K in Ks:
        ctx = context(K) if callable(context) else context
        if ctx + K > generator.preset.rope_max_seq_len:
            raise LatsimError(f"K={K} plus {ctx} context latents exceed the model's "
                              f"{generator.preset.rope_max_seq_len} frame positions")
        if res is generator.res and ctx == 0:
            generator.check_fits(K)
        rows.append(make_row(generator.preset, res, K,
                             time_forwards(generator, K, reps, warmup, res=res, context=ctx),
                             context=ctx))
    return rows


def paper_rows(generator, resolutions: tuple[str, ...], Ks: tuple[int, ...],
               reps: int = 30, warmup: int = 10) -> list[ForwardRow]:
    """The paper's workload (:data:`PAPER_CONTEXT`) and the context-free forward of the same
    shapes, per resolution and K: pairs of rows, like-for-like first."""
    rows = []
    for name in resolutions:
        res = resolution(name)
        for K in Ks:
            rows += forward_rows(generator, (K,), reps, warmup, res=res, context=paper_context)
            if paper_context(K):
                rows += forward_rows(generator, (K,), reps, warmup, res=res, context=0)
    return rows


# ---------------------------------------------------------------- tables


def format_table(rows: list[ForwardRow], device: str) -> str:
    """The context-free per-forward table. The paper's time of each K is beside it for
    orientation; ours/paper is left blank, the paper timing another workload (a cached
    forward over 21 - K context latents: :func:`format_paper_table`)."""
    lines = [
        f"per-forward time, one transformer forward on K latents, no context ({device})",
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
        lines.append(f"K=3 / K=1: ours {by_k[3].median_ms / by_k[1].median_ms:.2f}x without "
                     f"context, paper 2.05x (with 21 - K context latents)")
    if any(r.paper_ms is not None and r.ratio_to_paper is None for r in rows):
        lines.append("paper: a cached forward over 21 - K context latents, another workload: "
                     "ours/paper is in the like-for-like table")
    return "\n".join(lines)


def format_paper_table(rows: list[ForwardRow], device: str) -> str:
    """The like-for-like comparison with the paper's Table 2(a): per resolution and K the
    cached forward over 21 - K context latents, the paper's time and ours/paper, and the
    context-free time beside it."""
    lines = [
        f"like for like with the paper's Table 2(a) ({device}): {PAPER_CONTEXT}",
        f"{'res':>5} {'K':>3} {'ctx':>4} {'q/kv tokens':>13} {'median ms':>10} {'p10':>8} "
        f"{'p90':>8} {'TFLOP/s':>8} {'paper ms':>9} {'ours/paper':>10} {'no-ctx ms':>10}",
    ]
    free = {(r.resolution, r.K): r for r in rows if r.context == 0}
    like = [r for r in rows if r.like_for_like]
    for r in like:
        tpf = r.tokens // r.K
        kv = f"{r.tokens}/{r.tokens + r.context * tpf}"
        paper = f"{r.paper_ms:.1f}" if r.paper_ms is not None else "–"
        ratio = f"{r.ratio_to_paper:.2f}" if r.ratio_to_paper is not None else "–"
        plain = free.get((r.resolution, r.K))
        lines.append(
            f"{r.resolution:>5} {r.K:>3} {r.context:>4} {kv:>13} {r.median_ms:>10.2f} "
            f"{r.p10_ms:>8.2f} {r.p90_ms:>8.2f} {r.tflops:>8.1f} {paper:>9} {ratio:>10} "
            f"{plain.median_ms if plain else float('nan'):>10.2f}"
        )
    for name in dict.fromkeys(r.resolution for r in like):
        ratios = k3_over_k1(rows, name)
        if ratios["cached"] is not None:
            plain, ref = ratios["no_context"], ratios["paper"]
            lines.append(
                f"{name} K=3 / K=1: ours {ratios['cached']:.2f}x"
                + (f" (no context {plain:.2f}x)" if plain is not None else "")
                + ", paper " + (f"{ref:.2f}x" if ref is not None else "–"))
    return "\n".join(lines)


def k3_over_k1(rows: list[ForwardRow], res_name: str) -> dict[str, float | None]:
    """K=3 / K=1 forward-time ratios at one resolution, with and without the context."""
    def ratio(like: bool) -> float | None:
        by_k = {r.K: r.median_ms for r in rows
                if r.resolution == res_name and (r.like_for_like if like else r.context == 0)}
        return by_k[3] / by_k[1] if 1 in by_k and 3 in by_k else None

    return {"cached": ratio(True), "no_context": ratio(False),
            "paper": PAPER_K3_OVER_K1.get(res_name)}


# ---------------------------------------------------------------- the report file


class Report:
    """``gpu_check.json``, rewritten atomically (temp file + rename) at every change."""

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = path
        self._t0 = time.perf_counter()
        self.data: dict = {"format": FORMAT, "status": "running",
                           "sections": {name: "pending" for name in SECTIONS},
                           "errors": {}, **meta}
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = time.perf_counter() - self._t0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.data)

    def run(self, name: str, work: Callable[[], object]) -> object | None:
        """Run one section: marked running, then done with its result (or failed with the
        error, which does not stop later sections; an interrupt is recorded and re-raised)."""
        self.data["sections"][name] = "running"
        self.write()
        try:
            value = work()
        except Exception as exc:  # noqa: BLE001 - recorded; the next sections still run
            error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            self.data["sections"][name] = "failed"
            self.data["errors"][name] = error
            self.write()
            print(f"gpu_check: {name} failed: {error}", file=sys.stderr, flush=True)
            return None
        except BaseException:
            self.data["sections"][name] = "interrupted"
            self.data["status"] = "interrupted"
            self.write()
            raise
        self.data[name] = value
        self.data["sections"][name] = "done"
        self.write()
        return value

    def skip(self, name: str, why: str) -> None:
        self.data["sections"][name] = f"skipped: {why}"
        self.write()

    def finish(self) -> int:
        """Write the final status; the exit status (1 if a section failed)."""
        self.data["status"] = "failed" if self.data["errors"] else "complete"
        self.write()
        return 1 if self.data["errors"] else 0


# ---------------------------------------------------------------- the script


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check"))
    parser.add_argument("--generator", default="wan",
                        help="wan (every section), or another registered generator that "
                        "times its forwards (ltx: Table 2(b)'s K = 45 beside the paper)")
    parser.add_argument("--preset", default=None, help="default: the generator's full size")
    parser.add_argument("--resolution", default=None, help="default: wan 480p, ltx 448p")
    parser.add_argument("--Ks", type=int, nargs="+", default=None)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--paper-resolutions", nargs="+", default=list(PAPER_RESOLUTIONS))
    parser.add_argument("--paper-Ks", type=int, nargs="+", default=list(PAPER_KS))
    parser.add_argument("--paper-reps", type=int, default=30, help="the paper's: 30")
    parser.add_argument("--paper-warmup", type=int, default=10, help="the paper's: 10")
    parser.add_argument("--duration", type=float, default=60.0, help="live run length (s)")
    parser.add_argument("--short-K", type=int, default=3)
    parser.add_argument("--long-K", type=int, default=21)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--decode", action="store_true", help="VAE decode inside C")
    parser.add_argument("--skip-paper", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    preset, res = GENERATOR_DEFAULTS.get(args.generator, (None, None))
    args.preset = args.preset or preset
    args.resolution = args.resolution or res
    if args.Ks is None:
        args.Ks = list(DEFAULT_KS if args.generator == "wan" else OTHER_KS)
    return args


def _check_args(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise LatsimError(
            f"CUDA is not available (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'}): run this on a GPU machine"
        )
    if args.reps < 20 and args.device == "cuda":
        raise LatsimError("--reps must be >= 20")
    for value in (args.reps, args.paper_reps, *args.Ks, *args.paper_Ks):
        if value <= 0:
            raise LatsimError(f"counts and K must be positive integers, got {value}")
    if args.paper_warmup < 0:
        raise LatsimError(f"--paper-warmup must be >= 0, got {args.paper_warmup}")
    if args.generator != "wan":
        from latsim.plugins import load_generator

        load_generator(args.generator)
        return
    model_preset(args.preset)
    for name in (args.resolution, *args.paper_resolutions):
        resolution(name)


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    args = _args(argv)
    try:
        _check_args(args)
    except LatsimError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    if args.generator != "wan":
        return _other_generator(args)
    import torch

    from harness.generators.device import device_name
    from harness.generators.wan import WanConfig, WanGenerator
    from harness.measure.folder import versions

    preset, res = model_preset(args.preset), resolution(args.resolution)
    device = device_name(args.device)
    report = Report(args.out / "gpu_check.json", {
        "device": device, "preset": preset.name, "resolution": asdict(res),
        "versions": versions(), "args": {k: str(v) if isinstance(v, Path) else v
                                         for k, v in vars(args).items()},
        "paper_h200_ms": PAPER_H200_FORWARD_MS, "paper_k3_over_k1": PAPER_K3_OVER_K1,
        "paper_context": PAPER_CONTEXT,
    })
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    state: dict = {}

    def build() -> dict:
        built = WanGenerator(WanConfig(args.preset, args.resolution, args.steps, 0,
                                       args.decode, args.device))
        state["generator"] = built
        return {"n_params": built.n_params, "dtype": str(built.dtype)}

    report.run("model", build)
    generator = state.get("generator")
    if generator is None:
        for name in SECTIONS[1:]:
            report.skip(name, "no model")
        return report.finish()

    def forward() -> dict:
        rows = forward_rows(generator, tuple(args.Ks), args.reps)
        table = format_table(rows, device)
        print(table, flush=True)
        return {"resolution": res.name, "context": 0, "rows": [asdict(r) for r in rows],
                "table": table}

    def paper() -> dict:
        rows = paper_rows(generator, tuple(args.paper_resolutions), tuple(args.paper_Ks),
                          args.paper_reps, args.paper_warmup)
        table = format_paper_table(rows, device)
        print("\n" + table, flush=True)
        return {"workload": PAPER_CONTEXT, "reps": args.paper_reps,
                "warmup": args.paper_warmup, "rows": [asdict(r) for r in rows],
                "k3_over_k1": {name: k3_over_k1(rows, name)
                               for name in args.paper_resolutions},
                "table": table}

    report.run("forward", forward)
    if args.skip_paper:
        report.skip("paper", "--skip-paper")
    else:
        report.run("paper", paper)
    if args.skip_live:
        report.skip("live", "--skip-live")
    else:
        report.run("live", lambda: _live(args, generator, res))
    status = report.finish()
    print(f"\nwrote {report.path} in {report.data['elapsed_s']:.0f} s"
          + ("" if status == 0 else f"; failed: {', '.join(report.data['errors'])}"))
    return status


def _other_generator(args: argparse.Namespace) -> int:
    """The check of a generator other than Wan: its model, per-forward times (it must time
    its forwards alone, :class:`latsim.plugins.TimesForwards`), the paper's reference where
    there is one (LTX: Table 2(b)), and the live runs."""
    import torch

    from harness.generators.device import device_name
    from harness.measure.folder import versions
    from latsim.plugins import GeneratorConfig, TimesForwards, build_generator

    device = device_name(args.device)
    report = Report(args.out / "gpu_check.json", {
        "device": device, "generator": args.generator, "preset": args.preset,
        "resolution": args.resolution, "versions": versions(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "paper_ms": PAPER_LTX_MS if args.generator == "ltx" else None,
    })
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    state: dict = {}

    def build() -> dict:
        state["generator"] = built = build_generator(args.generator, GeneratorConfig(
            args.preset, args.resolution, args.steps, 0, args.decode, args.device))
        return built.describe().as_dict()

    report.run("model", build)
    generator = state.get("generator")
    if generator is None or not isinstance(generator, TimesForwards):
        why = "no model" if generator is None else "the generator cannot time a forward"
        for name in SECTIONS[1:3]:
            report.skip(name, why)
    else:
        report.run("forward", lambda: _forward_medians(generator, args, device))
        if args.skip_paper or args.generator != "ltx":
            report.skip("paper", "--skip-paper" if args.skip_paper else "no reference")
        else:
            report.run("paper", lambda: _ltx_paper(generator, args, device))
    if args.skip_live or generator is None:
        report.skip("live", "--skip-live" if args.skip_live else "no model")
    else:
        report.run("live", lambda: _live(args, generator, None))
    status = report.finish()
    print(f"\nwrote {report.path} in {report.data['elapsed_s']:.0f} s")
    return status


def _forward_medians(generator, args: argparse.Namespace, device: str) -> dict:
    rows = []
    for K in args.Ks:
        times = generator.forward_times(K, args.reps)
        rows.append({"K": K, "median_ms": statistics.median(times), "min_ms": min(times),
                     "max_ms": max(times), "n": len(times)})
    table = "\n".join([f"{args.generator} {args.preset} @ {args.resolution} on {device}",
                       "  K   median ms   min ms   max ms"]
                      + [f"{r['K']:>3} {r['median_ms']:>11.1f} {r['min_ms']:>8.1f} "
                         f"{r['max_ms']:>8.1f}" for r in rows])
    print(table, flush=True)
    return {"context": 0, "rows": rows, "table": table}


def _ltx_paper(generator, args: argparse.Namespace, device: str) -> dict:
    from harness.generators.ltx import PAPER_WORKLOAD

    rows = []
    for K, paper_ms in PAPER_LTX_MS.items():
        times = generator.forward_times(K, args.paper_reps, PAPER_LTX_CONTEXT,
                                        warmup=args.paper_warmup)
        ours = statistics.median(times)
        rows.append({"K": K, "context": PAPER_LTX_CONTEXT, "median_ms": ours,
                     "paper_ms": paper_ms, "ours_over_paper": ours / paper_ms})
    table = "\n".join([f"like for like with Table 2(b) ({args.preset} @ {args.resolution}, "
                       f"{device})", "  K  context   ours ms   paper ms   ours/paper"]
                      + [f"{r['K']:>3} {r['context']:>8} {r['median_ms']:>9.1f} "
                         f"{r['paper_ms']:>10.1f} {r['ours_over_paper']:>12.2f}" for r in rows])
    print("\n" + table, flush=True)
    return {"workload": PAPER_WORKLOAD, "reps": args.paper_reps, "warmup": args.paper_warmup,
            "rows": rows, "table": table}


def _live(args: argparse.Namespace, generator, res: Resolution | None) -> list[dict]:
    from harness.measure.run import MeasureConfig, measure
    from latsim.formatting import StatusLine

    config = MeasureConfig(
        generator=args.generator,
        preset=args.preset, resolution=args.resolution, Ks=(args.short_K, args.long_K),
        steps=args.steps, policies=("baseline", "speculative"), duration=args.duration,
        device=args.device, out=str(args.out / "live"), decode=args.decode,
        warmup_timed=10, drain=10.0,
    )
    with StatusLine() as status:
        results = measure(config, progress=status, generator=generator)
    live = [r.summary for r in results]
    print(f"\nlive runs ({args.duration:g} s each, {args.resolution}, steps={args.steps})")
    for s in live:
        print(f"  {s['policy']:>11} K={s['K']:>2} C={s['C_mean']:.3f}s "
              f"lead={s['lead']:.3f}s L50={_f(s['L50'])} L95={_f(s['L95'])} "
              f"stall={s['stall_pct']:.2f}% busy={s['busy_pct']:.1f}% "
              f"kernel={_f(s['kernel_activity'], 1)}%")
    return live


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
