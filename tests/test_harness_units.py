"""Harness pieces without a long live run: presets and FLOPs, generator jobs, telemetry
without NVML, the GPU check's table, the wall-clock driver against the simulator, CLI errors.
"""

from __future__ import annotations

import sys
import types

import pytest
from typer.testing import CliRunner

from harness.generators.presets import (
    MODEL_PRESETS,
    RESOLUTIONS,
    forward_flops,
    model_preset,
    resolution,
)
from harness.telemetry.nvml import NvmlSampler
from harness.telemetry.reduce import UtilSample, time_weighted_activity
from latsim.cli import app
from latsim.controller import ControllerConfig, StartJob
from latsim.controller.policies import BASELINE, SPECULATIVE
from latsim.controller.timing import Timing
from latsim.errors import LatsimError
from latsim.model.traces import Trace
from tests.helpers import assert_live_run_matches_simulation, comparable_horizon, replay_costs

runner = CliRunner()


# ---------------------------------------------------------------- presets


def test_wan_presets_match_the_architecture():
    wan = MODEL_PRESETS["wan-1.3b"]
    assert (wan.dim, wan.num_heads, wan.head_dim, wan.num_layers, wan.ffn_dim) == (
        1536, 12, 128, 30, 8960)
    assert wan.text_dim == 4096 and wan.patch == (1, 2, 2) and wan.in_channels == 16
    r480 = RESOLUTIONS["480p"]
    assert (r480.latent_h, r480.latent_w) == (60, 104)
    assert r480.tokens_per_frame(wan) == 1560
    with pytest.raises(LatsimError, match="unknown preset"):
        model_preset("wan-14b")
    with pytest.raises(LatsimError, match="unknown resolution"):
        resolution("4k")


def test_the_wan_preset_builds_a_model_of_wan21_t2v_13bs_size():
    """Built from the preset (on the meta device: no memory, no weights), diffusers' Wan
    transformer has Wan2.1-T2V-1.3B's parameter count: 1.42e9 (2.65 GiB in bf16)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    with torch.device("meta"):
        model = diffusers.WanTransformer3DModel(**MODEL_PRESETS["wan-1.3b"].transformer_kwargs())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(1.42e9, rel=0.01)


def test_wan_flops_are_in_the_expected_range():
    # ~1.3e9 parameters in the blocks: 2 x params x tokens plus attention
    wan, r480 = MODEL_PRESETS["wan-1.3b"], RESOLUTIONS["480p"]
    per_token = forward_flops(wan, r480, 1) / 1560
    assert 2.4e9 < per_token < 3.2e9
    assert forward_flops(wan, r480, 3) > 3 * forward_flops(wan, r480, 1)  # attention is N^2


def test_analytic_flops_match_torchs_flop_counter_on_the_tiny_model():
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from harness.generators.wan import WanConfig, WanGenerator

    gen = WanGenerator(WanConfig("tiny", "small"))
    K = 3
    x = gen._randn(gen.latent_shape(K), 1)
    with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH), \
            FlopCounterMode(display=False) as counter:
        gen.model(x, torch.tensor([500.0]), gen.embedding(1), return_dict=False)
    counted = counter.get_total_flops()
    analytic = forward_flops(gen.preset, gen.res, K)
    assert abs(analytic - counted) / counted < 0.05


# ---------------------------------------------------------------- generator


@pytest.fixture(scope="module")
def decoding_generator():
    pytest.importorskip("diffusers")
    from harness.generators.wan import WanConfig, WanGenerator

    return WanGenerator(WanConfig("tiny", "tiny", steps=2, context=2, decode=True))


def test_a_job_uses_context_and_carries_the_vae_cache(decoding_generator):
    gen = decoding_generator
    gen.reset_stream(4)
    first = gen.run_job(StartJob(1, "refill", 4, 4, 1, 4), decode_group=1)
    assert first.context == 2 and first.K == 4 and first.wall_s > 0
    # the prebuffer primed the causal cache: a latent decodes to r = 4 frames
    assert (first.decoded_latents, first.decoded_frames) == (1, 4)
    replan = gen.run_job(StartJob(2, "replan", 6, 4, 2, 6), decode_group=4)
    assert (replan.decoded_latents, replan.decoded_frames) == (4, 16)
    early = gen.run_job(StartJob(3, "replan", 1, 4, 3, 1), decode_group=0)
    assert early.context == 1 and early.decoded_frames == 0  # only one latent before it


def test_warmup_times_jobs_and_rejects_k_beyond_the_models_positions(decoding_generator):
    jobs = decoding_generator.warmup(2, untimed=1, timed=2, decode_group=1, gap_s=0.01)
    assert len(jobs) == 2 and all(j.wall_s > 0 for j in jobs)
    with pytest.raises(LatsimError, match="frame positions"):
        decoding_generator.warmup(5000)


def test_cuda_without_a_gpu_is_a_one_line_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from harness.generators.wan import WanConfig, WanGenerator

    with pytest.raises(LatsimError, match="no CUDA GPU"):
        WanGenerator(WanConfig(device="cuda"))


# ---------------------------------------------------------------- telemetry


def test_time_weighted_activity_weights_each_sample_by_its_period():
    samples = [UtilSample(10.0, 50.0), UtilSample(11.0, 100.0), UtilSample(13.0, 0.0)]
    # (9,10]: 50, (10,11]: 100, (11,13]: 0 -> window [10, 13]: (100*1 + 0*2) / 3
    assert time_weighted_activity(samples, 10.0, 13.0) == pytest.approx(100 / 3)
    assert time_weighted_activity(samples, 9.5, 10.5) == pytest.approx(75.0)
    assert time_weighted_activity(samples, 20.0, 30.0) is None
    assert time_weighted_activity([], 0.0, 1.0) is None


def test_without_pynvml_kernel_activity_is_unavailable_with_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sampler = NvmlSampler()
    sampler.start()
    activity = sampler.activity(0.0, 10.0)
    sampler.stop()
    assert sampler.available is False
    assert activity.percent is None and "NVML unavailable" in activity.note


def test_when_nvml_init_fails_kernel_activity_is_unavailable(monkeypatch):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("Driver Not Loaded")

    fake.NVMLError = NVMLError
    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = NvmlSampler()
    sampler.start()
    activity = sampler.activity(0.0, 1.0)
    assert activity.percent is None and "Driver Not Loaded" in activity.note


def test_nvml_samples_are_collected_and_reduced(monkeypatch):
    fake = types.ModuleType("pynvml")
    start_us: list[int] = []  # the sampler's own start stamp: samples follow it, whatever
    # the wall clock did between this line and start()

    class NVMLError(Exception):
        value = 6

    class Value:
        def __init__(self, v):
            self.uiVal = v

    class Sample:
        def __init__(self, ts, v):
            self.timeStamp, self.sampleValue = ts, Value(v)

    def get_samples(handle, kind, last):
        if not start_us:
            start_us.append(last)
        t0 = start_us[0]
        return 1, [Sample(t0 + 100_000 * i, 40 if i % 2 else 80) for i in range(1, 11)
                   if t0 + 100_000 * i > last]

    fake.NVMLError = NVMLError
    fake.NVML_ERROR_NOT_FOUND = 6
    fake.NVML_GPU_UTILIZATION_SAMPLES = 1
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: object()
    fake.nvmlDeviceGetSamples = get_samples
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = NvmlSampler(period_s=0.01)
    sampler.start()
    sampler.stop()
    assert sampler.source == "nvml-samples" and len(sampler.samples) == 10
    # (0.1, 0.9] holds samples 2..9: four at 80 %, four at 40 %
    activity = sampler.activity(start_us[0] / 1e6 + 0.1, start_us[0] / 1e6 + 0.9)
    assert activity.percent == pytest.approx(60.0, rel=1e-3)


# ---------------------------------------------------------------- GPU check, CPU parts


def test_gpu_check_table_has_the_paper_reference_beside_ours():
    from harness.tools.gpu_check import PAPER_H200_MS, format_table, make_row

    wan, r480 = MODEL_PRESETS["wan-1.3b"], RESOLUTIONS["480p"]
    rows = [make_row(wan, r480, 1, [70.0] * 19 + [90.0]), make_row(wan, r480, 3, [150.0] * 20)]
    assert rows[0].median_ms == 70.0 and rows[0].paper_ms == PAPER_H200_MS[1]
    assert rows[0].tflops == pytest.approx(forward_flops(wan, r480, 1) / 0.070 / 1e12)
    text = format_table(rows, "test")
    assert "77.5" in text and "158.9" in text and "paper 2.05x" in text


def test_gpu_check_times_forwards_on_the_tiny_preset_and_refuses_without_cuda(capsys):
    torch = pytest.importorskip("torch")
    from harness.generators.wan import WanConfig, WanGenerator
    from harness.tools.gpu_check import forward_rows, main

    rows = forward_rows(WanGenerator(WanConfig("tiny", "tiny")), (1, 3), reps=3)
    assert [r.K for r in rows] == [1, 3] and all(r.median_ms > 0 for r in rows)
    if not torch.cuda.is_available():
        assert main([]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "CUDA is not available" in err[0]


# ---------------------------------------------------------------- driver vs simulator


@pytest.mark.parametrize("policy", [BASELINE, SPECULATIVE])
def test_wall_clock_driver_reproduces_the_simulator_given_its_job_times(policy):
    """The live driver against the simulator, pathwise and without a wall-clock tolerance:
    the simulator is fed the job times the live controller saw (a fixed C = 50 ms plus the
    run's own dispatch and hand-back delays), and every record must agree up to the horizon
    where the run's own event timings show an event handled out of order
    (tests.helpers.comparable_horizon). A disturbed run (horizon short of the last condition)
    is repeated, at most twice; how close a run comes to the fixed-C simulation on the wall
    clock is a figure bench/bench_live.py reports.

    Timing: delta = 0.25 s, T = 0.5 s; lead 80 ms. Under latent commitment the condition at
    2.45 s comes while a refill runs, so its replan starts when that job ends (a time the live
    run measured), the one at 2.9 s replans at once, and 1.30 and 1.32 s are served by the
    refill due at 1.42 s; under chunk commitment 1.30 and 2.45 s are superseded.
    """
    from harness.live.driver import DriverConfig, LiveDriver, SleepExecutor

    C, duration = 0.05, 4.0
    trace = Trace("t", (0.4, 1.3, 1.32, 2.45, 2.9), duration)
    config = ControllerConfig(Timing(2, 4, 16.0), policy, 0.08)
    last_shown = 3.0 + 1e-6  # the condition at 2.9 s plays at 3.0 s under both policies
    attempts = []
    for _ in range(3):
        driver = LiveDriver(config, SleepExecutor(C), trace, DriverConfig(duration))
        result = driver.run()
        assert not result.interrupted and result.stop_reason == "complete"
        attempts.append((comparable_horizon(driver, result), driver, result))
        if attempts[-1][0] > last_shown:
            break
    _, driver, result = max(attempts, key=lambda a: a[0])
    # the executor never returns early; the controller's view adds only non-negative delays
    assert all(c >= C - 1e-9 for c in replay_costs(result))
    horizon = assert_live_run_matches_simulation(driver, result)
    if horizon > last_shown:  # the whole trace was compared: every condition was shown
        assert all(c.displayed for c in result.records.conditions)
        assert len(result.records.conditions) == len(trace.times)


def test_a_late_slot_tick_is_handled_before_a_job_that_finished_after_it_was_due(monkeypatch):
    """Events are handled in the order they were due, not the order threads posted them.

    The slot ticks here fire 30 ms late (a player thread that did not get the CPU), while
    each refill (C = 55 ms, lead 50 ms) finishes ~5 ms after the slot it fills was due. The
    driver used to handle the job first and start the slot late with no stall recorded, so
    the playback grid drifted; now it waits for the due tick: the stall starts when the slot
    was due and every late slot has its stall."""
    import harness.live.driver
    from harness.live.driver import DriverConfig, LiveDriver, SleepExecutor
    from harness.live.player import PlayerClock
    from latsim.controller import SlotDue

    late = 0.03

    class LatePlayer(PlayerClock):
        """Posts slot ticks ``late`` s after they are due, reporting them as due on time."""

        def __init__(self, post, spin_s):
            super().__init__(lambda item, at, fired: post(item[0], item[1], fired), spin_s)

        def schedule(self, at, event):
            super().schedule(at + (late if type(event) is SlotDue else 0.0), (event, at))

        def next_due(self):
            with self._cond:
                return min((item[1] for _, _, item in self._heap), default=None)

    monkeypatch.setattr(harness.live.driver, "PlayerClock", LatePlayer)
    config = ControllerConfig(Timing(2, 4, 16.0), BASELINE, 0.05)
    result = LiveDriver(config, SleepExecutor(0.055), Trace("t", (), 2.0),
                        DriverConfig(2.0)).run()
    assert not result.interrupted
    due = {e.position: e.scheduled for e in result.events if e.kind == "slot_due"}
    stalls = {s.position: s for s in result.records.stalls}
    late_slots = [s for s in result.records.slots if s.t_start > due[s.position] + 1e-9]
    assert late_slots, "no refill finished after its slot was due: nothing was tested"
    for slot in late_slots:
        assert slot.position in stalls, slot
        assert stalls[slot.position].t_start == pytest.approx(due[slot.position], abs=1e-9)
        assert stalls[slot.position].t_end == pytest.approx(slot.t_start, abs=1e-9)
    # and nothing was handled out of order
    assert all(e.now == (e.happened if e.scheduled is None else e.scheduled)
               for e in result.events)


# ---------------------------------------------------------------- CLI


def test_measure_rejects_bad_input_with_one_line(tmp_path):
    pytest.importorskip("diffusers", reason="the live extra is not installed (the wan "
                        "generator's checks come first)")
    bad_trace = tmp_path / "bad.jsonl"
    bad_trace.write_text('{"t": 2}\n{"t": 1}\n')
    dense = tmp_path / "dense.jsonl"
    dense.write_text('{"meta": {"duration": 2.0}}\n' + "".join(f'{{"t": {i / 1000}}}\n'
                                                               for i in range(300)))
    cases = [
        (["measure", "--preset", "huge"], "unknown preset"),
        (["measure", "--resolution", "8k"], "unknown resolution"),
        (["measure", "--policy", "eager"], "unknown policy"),
        (["measure", "--K", "0"], "--K must be a positive integer <= 4096, got 0"),
        (["measure", "--K", "5000"], "--K must be a positive integer <= 4096"),
        (["measure", "--device", "tpu"], "unknown device"),
        (["measure", "--trace", str(bad_trace), "--out", str(tmp_path)], "unsorted"),
        (["measure", "--trace", str(tmp_path / "missing.jsonl")], "no such file"),
        (["measure", "--K", "1000", "--context", "100", "--duration", "300", "--out",
          str(tmp_path)], "frame positions"),
        # every option has a range, named in the error
        (["measure", "--fps", "1e9"], "--fps must be >= 1 and <= 240 frames per second"),
        (["measure", "--fps", "nan"], "--fps must be >= 1 and <= 240 frames per second"),
        (["measure", "--duration", "1e9"], "--duration must be a positive number <= 3600 s"),
        (["measure", "--duration", "inf"], "--duration must be a positive number <= 3600 s"),
        (["measure", "--rate", "nan"], "--rate must be >= 0 and <= 100 conditions per second"),
        (["measure", "--lead", "-1"], "--lead must be >= 0 and <= 600 s"),
        (["measure", "--job-timeout", "0"], "--job-timeout must be a positive number <= 3600 s"),
        (["measure", "--r", "0"], "--r must be a positive integer <= 64"),
        (["measure", "--steps", "0"], "--steps must be a positive integer <= 1000"),
        (["measure", "--seed", "-1"], "--seed must be an integer >= 0 and <= 4294967295"),
        (["measure", "--context", "-1"], "--context must be an integer >= 0 and <= 1024"),
        (["measure", "--warmup", "0"], "--warmup must be a positive integer <= 1000"),
        (["measure", "--calibrate", "100000"], "--calibrate must be an integer >= 0 and <= 1000"),
        (["measure", "--threads", "0"], "--threads must be a positive integer <= 1024"),
        (["measure", "--K", *[str(k) for k in range(1, 18)]], "at most 16 values"),
        (["measure", "--K", "1", "2", "3", "4", "--duration", "3600"], "6 h"),
        (["measure", "--trace", str(dense), "--out", str(tmp_path)],
         "300 conditions in 2 s, more than 100 per second"),
        (["measure", "--K", "4", "--out", str(tmp_path / "a-file" / "runs")],
         "--out " + str(tmp_path / "a-file" / "runs") + ": cannot write there"),
        # --updates takes simulate's spec, the kinds a live run can replay
        (["measure", "--updates", "bernoulli:0.1"], "a live run takes poisson:RATE or trace:"),
        (["measure", "--updates", f"traces:{tmp_path}"], "a live run takes poisson:RATE"),
        (["measure", "--updates", "poisson:1", "--rate", "2"], "--updates or --rate/--trace"),
        (["measure", "--updates", "poisson:-1"], "poisson rate must be >= 0"),
        (["measure", "--updates", f"trace:{bad_trace}", "--out", str(tmp_path)], "unsorted"),
        (["client", "ws://127.0.0.1:9", "--updates", "bernoulli:0.5", "--out",
          str(tmp_path / "c")], "a live run takes"),
    ]
    (tmp_path / "a-file").write_text("not a folder")
    try:
        import torch

        if not torch.cuda.is_available():
            cases.append((["measure", "--device", "cuda"], "no CUDA GPU"))
    except ImportError:
        pass
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)


def test_updates_is_the_rate_or_the_trace_of_a_live_run(tmp_path):
    """``--updates poisson:R`` is ``--rate R`` and ``trace:PATH`` is ``--trace PATH``, so
    the same seed draws the same conditions."""
    from harness.cli import updates_as_trace_and_rate

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 1.0}\n')
    assert updates_as_trace_and_rate("poisson:0.5", None, 0.1) == (None, 0.5)
    assert updates_as_trace_and_rate(f"trace:{trace}", None, 0.1) == (trace, 0.1)
    assert updates_as_trace_and_rate(None, trace, 2.0) == (trace, 2.0)
