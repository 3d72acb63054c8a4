"""The ``ltx`` live generator on the tiny preset: protocols, jobs, determinism, the VAE's
frame counts, forward timing (plain and over a KV cache), and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from latsim.controller import StartJob
from latsim.errors import LatsimError
from latsim.plugins.protocols import (
    GeneratorConfig,
    JobTiming,
    LiveGenerator,
    TimesForwards,
)

pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

from harness.generators import ltx  # noqa: E402
from tests.helpers import rows_of  # noqa: E402


def tiny(**kwargs) -> ltx.LTXGenerator:
    return ltx.build(GeneratorConfig(**{"steps": 2, **kwargs}))


@pytest.fixture(scope="module")
def gen() -> ltx.LTXGenerator:
    return tiny(context=2, decode=True)


# ---------------------------------------------------------------- presets and errors


def test_presets_match_ltx23_and_the_papers_resolution():
    full = ltx.MODEL_PRESETS["ltx-2.3"]
    assert (full.num_layers, full.num_heads, full.head_dim, full.dim, full.ffn_dim) == (
        48, 32, 128, 4096, 16384)
    assert (full.audio_dim, full.caption_channels, full.text_len, full.in_channels) == (
        2048, 3840, 1024, 128)
    assert full.text_dim == 4096 and ltx.MODEL_PRESETS["ltx-2"].text_dim == 3840
    for preset in ltx.MODEL_PRESETS.values():
        assert (preset.vae.temporal_scale, preset.vae.spatial_scale) == (8, 32)
    paper = ltx.RESOLUTIONS["448p"]
    assert paper.pixels == (448, 832) and paper.tokens_per_frame == 364
    assert ltx.paper_context(45) == 1 and ltx.audio_tokens(45) == 375


@pytest.mark.parametrize(("config", "match"), [
    (GeneratorConfig(preset="ltx-99"), "unknown preset 'ltx-99'.*tiny, tiny-2.0, ltx-2, ltx-2.3"),
    (GeneratorConfig(resolution="4k"), "unknown resolution '4k'.*448p"),
    (GeneratorConfig(cost="fixed:1"), "measures its job time; --cost is for the sleep"),
    (GeneratorConfig(options=(("flow_shift", "3"),)), "no option 'flow_shift'.*audio"),
    (GeneratorConfig(options=(("audio", "loud"),)), "audio='loud'.*none, synced"),
    (GeneratorConfig(steps=0), "--steps"),
    (GeneratorConfig(context=-1), "--context"),
])
def test_bad_configs_are_one_line_errors(config, match):
    with pytest.raises(LatsimError, match=match) as info:
        ltx.build(config)
    assert "\n" not in str(info.value)


def test_weights_that_do_not_fit_are_refused_before_any_allocation(monkeypatch):
    monkeypatch.setattr(ltx, "_free_bytes", lambda torch, device: 2**30)
    with pytest.raises(LatsimError, match="ltx-2.3 needs about 7\\d.\\d GiB of float32"):
        ltx.build(GeneratorConfig(preset="ltx-2.3", resolution="448p"))


def test_importing_the_module_imports_no_torch():
    code = "import sys, harness.generators.ltx; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- the generator


def test_it_is_a_live_generator_that_times_forwards_and_says_r_8(gen):
    assert isinstance(gen, LiveGenerator) and isinstance(gen, TimesForwards)
    info = gen.describe()
    assert (info.name, info.r, info.dtype, info.device) == ("ltx", 8, "float32", "cpu")
    assert info.label == "ltx:tiny@tiny,steps=2"
    assert info.parameters["family"] == "LTX-2" and info.parameters["n_params"] > 0
    assert info.parameters["audio"] == "none" and info.threads == torch.get_num_threads()


def test_a_job_stores_k_latents_at_its_positions_with_context(gen):
    stream = gen.new_stream(2)
    assert sorted(stream.store) == [0, 1]
    timing = gen.run_job(StartJob(5, "replan", 2, 3, 1, 1), decode_group=0, stream=stream)
    assert isinstance(timing, JobTiming)
    assert (timing.job_id, timing.kind, timing.K, timing.branch, timing.version) == (
        5, "replan", 3, 2, 1)
    assert timing.context == 1  # the job says one clean latent exists
    assert timing.device_s is None and (timing.decoded_latents, timing.decoded_frames) == (0, 0)
    assert 0 < timing.wall_s < 1.0
    assert sorted(stream.store) == [0, 1, 2, 3, 4]
    assert all(stream.store[p].shape == (1, 16, 1, 4, 4) for p in stream.store)
    timing = gen.run_job(StartJob(6, "refill", 5, 2, 1, 5), decode_group=0, stream=stream)
    assert timing.context == 2  # at most --context


def test_the_same_seed_gives_the_same_latents():
    job = StartJob(3, "refill", 2, 2, 0, 2)
    runs = []
    for seed in (0, 0, 1):
        g = tiny(seed=seed)
        g.reset_stream(2)
        g.run_job(job)
        runs.append(torch.cat([g._store[2], g._store[3]], dim=2))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_decoding_gives_r_8_frames_per_latent_after_the_first(gen):
    # The real behaviour of LTX-2's (non-causal) decoder: n latents -> 1 + 8 (n - 1) frames.
    z = gen._randn(gen.latent_shape(3), 1)
    with torch.inference_mode():
        assert gen.decode_latents(z[:, :, :1]).shape == (1, 3, 1, 128, 128)
        assert gen.decode_latents(z).shape == (1, 3, 17, 128, 128)
    # A job decodes its group with the latent before the branch as overlap: 8 per latent.
    stream = gen.new_stream(2, keep_frames=True)
    timing = gen.run_job(StartJob(1, "refill", 2, 2, 0, 2), decode_group=1, stream=stream)
    assert (timing.decoded_latents, timing.decoded_frames) == (1, 8)
    timing = gen.run_job(StartJob(2, "refill", 4, 2, 0, 4), decode_group=2, stream=stream)
    assert (timing.decoded_latents, timing.decoded_frames) == (2, 16)
    kind, shape, data = gen.payload(stream, 5)
    assert (kind, shape, len(data)) == ("pixels", (8, 128, 128, 3), 8 * 128 * 128 * 3)
    kind, shape, data = gen.payload(stream, 3)  # sampled, not decoded
    assert (kind, shape, len(data)) == ("latent", (16, 4, 4), 16 * 4 * 4 * 4)


def test_warmup_returns_the_timed_jobs(gen):
    timings = gen.warmup(2, untimed=1, timed=2, decode_group=1)
    assert [t.job_id for t in timings] == [-2, -3]
    assert all(t.decoded_frames == 8 and t.context == 2 for t in timings)


def test_synced_audio_runs_the_joint_forward():
    g = tiny(options=(("audio", "synced"),))
    g.reset_stream(2)
    timing = g.run_job(StartJob(1, "refill", 2, 2, 0, 2))
    assert timing.K == 2 and g._store[3].shape == (1, 16, 1, 4, 4)
    assert g.describe().label == "ltx:tiny@tiny,steps=2,audio=synced"


def test_the_ltx20_architecture_runs_jobs_and_decodes_too():
    g = tiny(preset="tiny-2.0", context=1, decode=True)
    assert g.describe().parameters["version"] == "2.0"
    timings = g.warmup(2, untimed=0, timed=2)
    assert all(t.context == 1 and t.decoded_frames == 8 for t in timings)


@pytest.mark.parametrize("preset", ["tiny", "tiny-2.0"])
def test_forward_times_and_the_cached_forward_match_a_full_forward(preset):
    gen = tiny(preset=preset)
    times = gen.forward_times(2, 3, warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert len(gen.forward_times(2, 2, context=3, warmup=0)) == 2
    # Over a KV cache holding the real keys and values of the context, the chunk's output
    # is the full forward's: the processor and the chunk's positions are right.
    K, ctx, tpf = 2, 3, gen.res.tokens_per_frame
    x = gen._pack(gen._randn(gen.latent_shape(ctx + K), 5))
    audio, audio_coords = gen._audio_inputs(K, 6)
    t = torch.tensor([700.0])
    coords = gen._video_coords(ctx + K)
    blocks = list(gen.model.transformer_blocks)
    heads, dim = gen.preset.num_heads, gen.preset.head_dim
    shape = (1, (ctx + K) * tpf, heads, dim)
    originals = [b.attn1.processor for b in blocks]
    try:
        with torch.inference_mode():
            full = gen._forward(x, audio, t, t, gen.embedding(0), coords, audio_coords)[0]
            recorders = [ltx._CachedSelfAttention(torch, torch.zeros(shape), torch.zeros(shape),
                                                  0) for _ in blocks]
            for block, recorder in zip(blocks, recorders, strict=True):
                block.attn1.processor = recorder
            recorded = gen._forward(x, audio, t, t, gen.embedding(0), coords, audio_coords)[0]
            for recorder in recorders:
                recorder.n_ctx = ctx * tpf
            chunk = gen._forward(x[:, ctx * tpf:], audio, t, t, gen.embedding(0),
                                 coords[:, :, ctx * tpf:], audio_coords)[0]
    finally:
        for block, processor in zip(blocks, originals, strict=True):
            block.attn1.processor = processor
    torch.testing.assert_close(recorded, full)
    torch.testing.assert_close(chunk, full[:, ctx * tpf:])
    with pytest.raises(LatsimError, match="forward_times needs"):
        gen.forward_times(0, 3)


@pytest.mark.slow
def test_ltx_runs_a_live_measurement_at_its_own_temporal_compression(tmp_path):
    """``latsim measure --generator ltx`` at the tiny preset: both policies complete, and
    the run says r = 8 (so K = 2 is T = 1 s at 16 fps, δ = 0.5 s, not Wan's 0.25 s)."""
    import json

    from typer.testing import CliRunner

    from latsim.cli import app

    result = CliRunner().invoke(app, [
        "measure", "--generator", "ltx", "--K", "2", "--steps", "2", "--rate", "0.5",
        "--duration", "6", "--warmup", "3", "--calibrate", "2", "--out", str(tmp_path),
        "--json"])
    assert result.exit_code == 0, result.stderr
    rows = rows_of(result.stdout)
    assert [row["policy"] for row in rows] == ["baseline", "speculative"]
    for row in rows:
        assert (row["r"], row["T"], row["delta"]) == (8, 1.0, 0.5)
        assert row["generator"] == "ltx" and row["cost"] == "live:ltx:tiny@tiny,steps=2"
        assert row["status"] == "complete" and row["dit_calls"] > 0
    config = json.loads((tmp_path / "K2-speculative" / "config.json").read_text())
    assert config["generator"]["r"] == 8 and config["generator"]["parameters"]["preset"] == "tiny"
    bad = CliRunner().invoke(app, ["measure", "--generator", "ltx", "--r", "4", "--K", "2",
                                   "--duration", "2", "--out", str(tmp_path / "r4")])
    assert bad.exit_code == 2 and "--r 4, but generator ltx's model makes 8" in bad.stderr
