"""The GPU check's CPU parts: the report written section by section, the paper's workload
(a cached forward over 21 - K context latents) and the job set-up outside the timed region.
Everything runs on the tiny preset on CPU in a few seconds."""

from __future__ import annotations

import json
import sys

import pytest

from harness.generators.presets import MODEL_PRESETS, RESOLUTIONS, forward_flops

torch = pytest.importorskip("torch")

from harness.generators.wan import WanConfig, WanGenerator  # noqa: E402
from harness.tools import gpu_check  # noqa: E402
from latsim.controller import StartJob  # noqa: E402

CPU_ARGS = ["--device", "cpu", "--preset", "tiny", "--resolution", "tiny", "--Ks", "1", "2",
            "--reps", "2", "--paper-resolutions", "tiny", "--paper-Ks", "1", "3",
            "--paper-reps", "2", "--paper-warmup", "1", "--steps", "1", "--skip-live"]


@pytest.fixture(scope="module")
def generator():
    return WanGenerator(WanConfig("tiny", "tiny", steps=2))


@pytest.fixture
def snapshots(monkeypatch):
    """Every version of gpu_check.json as written, read back from disk at once."""
    seen: list[dict] = []
    write = gpu_check.write_json

    def recording(path, payload):
        out = write(path, payload)
        assert not list(path.parent.glob(".*.partial*")), "a temp file was left behind"
        seen.append(json.loads(path.read_text()))
        return out

    monkeypatch.setattr(gpu_check, "write_json", recording)
    return seen


# ---------------------------------------------------------------- the report


def test_the_report_is_written_as_each_section_starts_and_ends(tmp_path, snapshots, capsys):
    assert gpu_check.main([*CPU_ARGS, "--out", str(tmp_path)]) == 0
    states = [(s["status"], tuple(s["sections"].values())) for s in snapshots]
    assert states[0] == ("running", ("pending",) * 4)
    # model, forward and paper each written running then done; live skipped; then final
    assert [st for _, st in states[1:8]] == [
        ("running", "pending", "pending", "pending"),
        ("done", "pending", "pending", "pending"),
        ("done", "running", "pending", "pending"),
        ("done", "done", "pending", "pending"),
        ("done", "done", "running", "pending"),
        ("done", "done", "done", "pending"),
        ("done", "done", "done", "skipped: --skip-live"),
    ]
    # the forward rows are on disk before the paper section starts
    forward_done = snapshots[4]
    assert [r["K"] for r in forward_done["forward"]["rows"]] == [1, 2]
    assert "paper" not in forward_done
    final = json.loads((tmp_path / "gpu_check.json").read_text())
    assert final == snapshots[-1] and final["status"] == "complete" and not final["errors"]
    paper = final["paper"]
    assert [(r["K"], r["context"], r["like_for_like"]) for r in paper["rows"]] == [
        (1, 20, True), (1, 0, False), (3, 18, True), (3, 0, False)]
    assert paper["k3_over_k1"]["tiny"]["cached"] > 0
    assert "21 - K" in final["paper_context"] and final["format"] == gpu_check.FORMAT
    assert "like for like" in capsys.readouterr().out


def test_a_failed_section_keeps_the_others_and_the_exit_status_says_so(
        tmp_path, snapshots, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory.\nTried to allocate 20 GiB")

    monkeypatch.setattr(gpu_check, "paper_rows", out_of_memory)
    assert gpu_check.main([*CPU_ARGS, "--out", str(tmp_path)]) == 1
    final = json.loads((tmp_path / "gpu_check.json").read_text())
    assert final["status"] == "failed"
    assert final["sections"] == {"model": "done", "forward": "done", "paper": "failed",
                                 "live": "skipped: --skip-live"}
    assert final["errors"] == {"paper": "RuntimeError: CUDA out of memory. Tried to allocate "
                                        "20 GiB"}
    assert [r["K"] for r in final["forward"]["rows"]] == [1, 2]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu_check: paper failed: RuntimeError: CUDA out of memory. Tried to "
                   "allocate 20 GiB"]


def test_an_interrupt_leaves_the_finished_sections_on_disk(tmp_path, snapshots, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "paper_rows", interrupt)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main([*CPU_ARGS, "--out", str(tmp_path)])
    final = json.loads((tmp_path / "gpu_check.json").read_text())
    assert final["status"] == "interrupted"
    assert final["sections"]["forward"] == "done" and final["sections"]["paper"] == "interrupted"
    assert final["forward"]["rows"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert gpu_check.main(["--device", "cpu", "--preset", "huge", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown preset" in err[0]
    assert not (tmp_path / "gpu_check.json").exists()


# ---------------------------------------------------------------- the paper's workload


def test_only_the_papers_workload_gets_a_ratio():
    wan, r480, r720 = MODEL_PRESETS["wan-1.3b"], RESOLUTIONS["480p"], RESOLUTIONS["720p"]
    cached = gpu_check.make_row(wan, r480, 1, [70.0] * 30, context=20)
    plain = gpu_check.make_row(wan, r480, 1, [30.0] * 30)
    assert cached.like_for_like and cached.ratio_to_paper == pytest.approx(70 / 77.5)
    assert not plain.like_for_like and plain.ratio_to_paper is None
    assert plain.paper_ms == cached.paper_ms == 77.5
    # K = 21 fills Wan's window: no context, and the paper's 720p time applies
    k21 = gpu_check.make_row(wan, r720, 21, [6000.0] * 30)
    assert k21.like_for_like and k21.ratio_to_paper == pytest.approx(6000 / 6432.8)
    k3 = gpu_check.make_row(wan, r480, 3, [145.0] * 30, context=18)
    table = gpu_check.format_paper_table([cached, plain, k3], "test")
    assert "0.90" in table and "2.07x" in table and "paper 2.05x" in table
    assert gpu_check.k3_over_k1([cached, plain, k3], "480p")["cached"] == pytest.approx(145 / 70)
    assert "ours/paper is in the like-for-like table" in gpu_check.format_table([plain], "t")


def test_the_cached_forward_flops_add_only_the_context_attention():
    wan, r480 = MODEL_PRESETS["wan-1.3b"], RESOLUTIONS["480p"]
    n = r480.tokens_per_frame(wan)
    extra = forward_flops(wan, r480, 1, cached_context=20) - forward_flops(wan, r480, 1)
    assert extra == 2 * wan.num_layers * 2 * n * (20 * n) * wan.dim
    # the paper's numbers are consistent with this context (see gpu_check.PAPER_CONTEXT)
    assert forward_flops(wan, r480, 1, cached_context=20) / 0.0775 / 1e12 == pytest.approx(
        176, abs=1)


def test_a_cached_forward_without_context_is_the_plain_forward(generator):
    x = generator._randn(generator.latent_shape(2), 5)
    ehs, t = generator.embedding(1), torch.tensor([500.0])
    tpf = generator.res.tokens_per_frame(generator.preset)
    shape = (1, 2 * tpf, generator.preset.num_heads, generator.preset.head_dim)
    blocks = generator.model.blocks
    with torch.inference_mode():
        plain = generator.model(x, t, ehs, return_dict=False)[0]
        originals = [b.attn1.processor for b in blocks]
        try:
            for block in blocks:
                block.attn1.processor = gpu_check.CachedSelfAttention(
                    torch, torch.zeros(shape), torch.zeros(shape), 0)
            cached = generator.model(x, t, ehs, return_dict=False)[0]
        finally:
            for block, processor in zip(blocks, originals, strict=True):
                block.attn1.processor = processor
    assert torch.equal(plain, cached)


def test_the_cached_context_shifts_positions_and_restores_the_model(generator):
    model, res = generator.model, generator.res
    x = generator._randn(generator.latent_shape(3), 6)
    ehs, t = generator.embedding(1), torch.tensor([500.0])
    tpf = res.tokens_per_frame(generator.preset)
    full = (1, 16, 18 + 3, res.latent_h, res.latent_w)
    with torch.inference_mode():
        before = model(x, t, ehs, return_dict=False)[0]
        with gpu_check.cached_context(generator, res, 3, 18):
            cos, _ = model.rope(x)
            cos_full, _ = model.rope.__class__.forward(model.rope, torch.empty(full))
            assert torch.equal(cos, cos_full[:, 18 * tpf:])  # positions 18, 19, 20
            assert all(isinstance(b.attn1.processor, gpu_check.CachedSelfAttention)
                       for b in model.blocks)
            out = model(x, t, ehs, return_dict=False)[0]
        after = model(x, t, ehs, return_dict=False)[0]
    assert out.shape == before.shape and not torch.equal(out, before)
    assert torch.equal(before, after) and "forward" not in model.rope.__dict__


def test_forward_rows_take_a_context_rule(generator):
    rows = gpu_check.forward_rows(generator, (1, 3), reps=1, warmup=0,
                                  context=gpu_check.paper_context)
    assert [(r.K, r.context, r.tokens) for r in rows] == [(1, 20, 16), (3, 18, 48)]
    assert all(r.median_ms > 0 and r.like_for_like for r in rows)


# ---------------------------------------------------------------- job set-up


def test_a_jobs_noise_and_sampler_are_set_up_before_its_timed_region(generator, monkeypatch):
    drawn: list[float] = []
    randn = generator._randn

    def recording(shape, seed):
        import time

        drawn.append(time.perf_counter())
        return randn(shape, seed)

    def no_lookup(*args, **kwargs):  # the host-syncing index lookup of the first step
        raise AssertionError("the scheduler looked its step index up")

    monkeypatch.setattr(generator, "_randn", recording)
    monkeypatch.setattr(generator.scheduler, "index_for_timestep", no_lookup)
    generator.reset_stream(2)
    drawn.clear()
    timing = generator.run_job(StartJob(1, "refill", 2, 2, 0, 2))
    assert drawn and all(t < timing.t_start for t in drawn)  # the noise and the embedding
    assert generator.scheduler.step_index == generator.config.steps
    assert all(p in generator._store for p in (2, 3))


def test_main_refuses_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0]
    assert "harness.tools.gpu_check" in sys.modules


def test_the_ltx_check_times_forwards_and_sets_k45_beside_the_paper(tmp_path, capsys):
    """``--generator ltx`` on the CPU at the tiny preset: per-forward medians, and the
    Table 2(b) K = 45 workload (one clean latent of cached context) beside 2016.2 ms."""
    args = ["--device", "cpu", "--generator", "ltx", "--preset", "tiny", "--resolution",
            "tiny", "--Ks", "1", "3", "--reps", "2", "--paper-reps", "2", "--paper-warmup",
            "0", "--skip-live", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "complete" and report["generator"] == "ltx"
    assert report["model"]["r"] == 8 and report["model"]["name"] == "ltx"
    assert [row["K"] for row in report["forward"]["rows"]] == [1, 3]
    (row,) = report["paper"]["rows"]
    assert (row["K"], row["context"], row["paper_ms"]) == (45, 1, 2016.2)
    assert row["ours_over_paper"] == pytest.approx(row["median_ms"] / 2016.2)
    assert report["sections"]["live"] == "skipped: --skip-live"
    assert "Table 2(b)" in capsys.readouterr().out
