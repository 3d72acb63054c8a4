"""Interrupted and failed live runs: Ctrl-C, SIGTERM, SIGKILL, generator errors, hung jobs,
full disks, unwritable output, bounded inputs.

Faults are injected the documented way (``LATSIM_FAULT``, :mod:`harness.live.faults`) into
a stand-in generator that sleeps a fixed C per job (no torch; each test a few seconds of
wall clock, K = 2 at 32 fps: delta = 0.125 s, T = 0.25 s); the subprocess tests at the end
run the real command line on the tiny preset (slow tier).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import harness.measure.run
from harness.live.driver import DriverConfig, LiveDriver
from harness.live.executor import GeneratorExecutor
from harness.live.faults import FAULT_ENV, Fault, parse_faults
from harness.live.lead import Calibration, choose_lead, default_job_timeout
from harness.live.recorder import RecordWriter
from harness.measure.calibration import calibrate
from harness.measure.run import MeasureConfig, measure
from latsim.cli import app
from latsim.controller import ControllerConfig, StartJob
from latsim.controller.policies import BASELINE
from latsim.controller.timing import Timing
from latsim.errors import Interrupted, LatsimError
from latsim.model.lead import LIVE
from latsim.model.traces import Trace
from latsim.plugins import GeneratorInfo, JobTiming
from latsim.run.folder import read_run_folder
from latsim.writing import writing

C = 0.01  # the stand-in generator's job time (s)


class FakeGenerator:
    """The generator's interface, sleeping ``C`` per job; ``hook(job)`` runs first."""

    threads = 1
    n_params = 0

    def __init__(self, c: float = C) -> None:
        self.c = c
        self.hook = None
        self.threads_seen: set[str] = set()

    def describe(self) -> GeneratorInfo:
        return GeneratorInfo("fake", f"fake:{self.c}", "cpu", "cpu: stand-in", "none", None,
                             {"n_params": 0}, 1)

    def reset_stream(self, K: int) -> None:
        pass

    def check_fits(self, K: int) -> None:
        pass

    def warmup(self, K, untimed=2, timed=10, decode_group=1, gap_s=0.0):
        return [self.run_job(StartJob(-(i + 1), "refill", K * (i + 1), K, 0, 0))
                for i in range(timed)]

    def run_job(self, job: StartJob, decode_group: int = 1) -> JobTiming:
        self.threads_seen.add(threading.current_thread().name)
        if self.hook is not None:
            self.hook(job)
        start = time.perf_counter()
        time.sleep(self.c)
        end = time.perf_counter()
        return JobTiming(job.job_id, job.kind, job.length, job.branch, job.version, 0, start,
                         end, None, 0, 0)


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch):
    """measure() records library versions (torch, diffusers); the stand-in needs neither,
    and no test here may build the real model."""
    import harness.measure.folder

    monkeypatch.setattr(harness.measure.run, "versions", lambda: {"stand-in": "1"})
    monkeypatch.setattr(harness.measure.folder, "versions", lambda: {"stand-in": "1"})

    def no_model(*args, **kwargs):
        raise AssertionError("the real model must not be built here")

    monkeypatch.setattr(harness.measure.run, "build_generator", no_model)
    monkeypatch.delenv(FAULT_ENV, raising=False)


def _config(out: Path, **kw) -> MeasureConfig:
    base = dict(Ks=(2,), fps=32.0, r=4, duration=0.6, rate=0.0, out=str(out),
                warmup_timed=3, warmup_untimed=0, warmup_gap_s=0.0, calibration_jobs=2,
                policies=("baseline", "speculative"))
    base.update(kw)
    return MeasureConfig(**base)


def _status(run_dir: Path) -> str:
    return read_run_folder(run_dir).status


# ---------------------------------------------------------------- the hook


def test_fault_specs_parse_and_bad_ones_are_one_line_errors():
    assert parse_faults("raise@3, stall@2:60,slow@4:0.5/K4-baseline,sigint@1/calibration") == (
        Fault("raise", 3), Fault("stall", 2, 60.0), Fault("slow", 4, 0.5, "K4-baseline"),
        Fault("sigint", 1, 0.0, "calibration"))
    assert parse_faults("") == ()
    assert str(Fault("slow", 4, 0.5, "K4")) == "slow@4:0.5/K4"
    for bad in ("explode@1", "raise", "raise@0", "raise@x", "stall@2", "stall@2:nan",
                "slow@1:1e9", "raise@1:5"):
        with pytest.raises(LatsimError, match="LATSIM_FAULT") as info:
            parse_faults(bad)
        assert "\n" not in str(info.value)


def test_a_malformed_fault_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "stall@two")
    gen = FakeGenerator()
    with pytest.raises(LatsimError, match="KIND@N"):
        measure(_config(tmp_path / "runs"), generator=gen)
    assert not gen.threads_seen


def test_faults_apply_to_the_numbered_job_of_matching_passes_only():
    gen = FakeGenerator()
    faults = parse_faults("raise@2/K4-baseline,slow@1:0.05")
    other = GeneratorExecutor(gen, 0, "K4-speculative", faults)
    for i in (1, 2, 3):
        timing = other.run_job(StartJob(i, "refill", 4 * i, 4, 0, 0))
        assert (timing.wall_s >= 0.05) == (i == 1)  # the slowdown counts in the job's time
    ours = GeneratorExecutor(gen, 0, "K4-baseline", faults)
    ours.run_job(StartJob(1, "refill", 4, 4, 0, 0))
    with pytest.raises(RuntimeError, match="raised"):
        ours.run_job(StartJob(2, "refill", 8, 4, 0, 0))


# ---------------------------------------------------------------- in-run calibration


def test_ctrl_c_during_calibration_stops_the_measurement(tmp_path, monkeypatch):
    """Ctrl-C in the calibration pass used to be swallowed: the runs went ahead and the
    command exited 0."""
    monkeypatch.setenv(FAULT_ENV, "sigint@2/calibration")
    root = tmp_path / "runs"
    with pytest.raises(Interrupted) as info:
        measure(_config(root), generator=FakeGenerator())
    message = str(info.value)
    assert message.startswith(f"kept nothing (no run folder under {root})")
    assert "Ctrl-C" in message and "calibration of K=2" in message
    assert not list(root.glob("K2-*"))
    assert json.loads((root / "measure.json").read_text())["interrupted"] is True


def test_calibrate_raises_when_interrupted_or_when_the_generator_fails():
    """calibrate() itself, without the hook: Ctrl-C (interrupt_main) in its second job, and
    a generator that raises."""
    import _thread

    timing = Timing(2, 4, 32.0)
    gen = FakeGenerator()

    def interrupt(job):
        if job.job_id == 2:
            gen.hook = None
            _thread.interrupt_main()

    gen.hook = interrupt
    with pytest.raises(Interrupted, match="calibration of K=2 stopped"):
        calibrate(gen, timing, 0.05, 4, 5.0, 0)

    def explode(job):
        raise ValueError("CUDA error: device-side assert")

    gen.hook = explode
    with pytest.raises(LatsimError, match="calibration of K=2 failed.*device-side assert"):
        calibrate(gen, timing, 0.05, 4, 5.0, 0)
    gen.hook = None
    done = calibrate(gen, timing, 0.05, 1, 5.0, 0)
    assert len(done.durations) >= 1 and done.slot_lateness and done.dispatch


def test_sigterm_during_calibration_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "sigterm@1/calibration")
    with pytest.raises(Interrupted, match="stopped by SIGTERM in the in-run calibration"):
        measure(_config(tmp_path / "runs"), generator=FakeGenerator())


def test_a_generator_error_during_calibration_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "raise@2/calibration")
    with pytest.raises(LatsimError) as info:
        measure(_config(tmp_path / "runs"), generator=FakeGenerator())
    message = str(info.value)
    assert "in-run calibration of K=2 failed" in message
    assert "job 2" in message and "InjectedFault" in message and "\n" not in message
    assert not list((tmp_path / "runs").glob("K2-*"))


# ---------------------------------------------------------------- Ctrl-C, SIGTERM, SIGKILL


def test_ctrl_c_in_a_run_says_what_was_kept_and_where(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "sigint@2/K2-speculative")
    root = tmp_path / "runs"
    with pytest.raises(Interrupted) as info:
        measure(_config(root), generator=FakeGenerator())
    assert str(info.value) == (f"kept 2 run folders under {root} (the last one partial: "
                               "K2-speculative; stopped by Ctrl-C)")
    assert _status(root / "K2-baseline") == "complete"
    assert _status(root / "K2-speculative") == "interrupted"
    summary = json.loads((root / "K2-speculative" / "summary.json").read_text())
    assert summary["stop_reason"] == "KeyboardInterrupt" and summary["status"] == "interrupted"


def test_sigterm_is_handled_like_ctrl_c_and_the_handlers_are_restored(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "sigterm@2/K2-baseline")
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    root = tmp_path / "runs"
    with pytest.raises(Interrupted) as info:
        measure(_config(root), generator=FakeGenerator())
    assert str(info.value) == (f"kept 1 run folder under {root} (the last one partial: "
                               "K2-baseline; stopped by SIGTERM)")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert _status(root / "K2-baseline") == "interrupted"
    config = json.loads((root / "K2-baseline" / "config.json").read_text())
    assert config["stop_reason"] == "SIGTERM"
    assert not (root / "K2-speculative").exists()


def test_sigterm_in_the_warm_up_stops_with_nothing_kept(tmp_path):
    gen = FakeGenerator()

    def terminate(job):
        if job.job_id == -2:
            os.kill(os.getpid(), signal.SIGTERM)

    gen.hook = terminate
    with pytest.raises(Interrupted, match="kept nothing .*SIGTERM in the warm-up of K=2"):
        measure(_config(tmp_path / "runs"), generator=gen)


def test_a_killed_run_leaves_a_folder_that_reads_incomplete(tmp_path):
    """What SIGKILL leaves: the folder as it is mid-run (copied as job 2 starts): config
    says running, no summary; the record CSVs are readable."""
    gen = FakeGenerator()
    root = tmp_path / "runs"
    snapshot = tmp_path / "killed"

    def arm(driver: LiveDriver) -> None:
        def copy_at_job_2(job):
            if job.job_id == 2 and not snapshot.exists():
                shutil.copytree(root / "K2-baseline", snapshot)

        gen.hook = copy_at_job_2

    measure(_config(root, policies=("baseline",), lead=0.05), generator=gen, on_driver=arm)
    killed = read_run_folder(snapshot)
    assert killed.config["status"] == "running" and not (snapshot / "summary.json").exists()
    assert killed.status == "incomplete" and not killed.complete
    assert [r.job_id for _, r in killed.records("jobs")][:1] == [0]  # readable records
    assert _status(root / "K2-baseline") == "complete"


# ---------------------------------------------------------------- hung and slow jobs


def test_a_hung_job_fails_the_run_and_stops_the_measurement(tmp_path, monkeypatch):
    """A job that does not return: the run fails after --job-timeout, its folder says which
    job hung for how long, no further run shares the generator, and the stalled thread is
    released (the executor is closed)."""
    monkeypatch.setenv(FAULT_ENV, "stall@2:60/K2-baseline")
    root = tmp_path / "runs"
    gen = FakeGenerator()
    started = time.perf_counter()
    with pytest.raises(LatsimError) as info:
        measure(_config(root, lead=0.05, job_timeout=0.3), generator=gen)
    assert time.perf_counter() - started < 10
    message = str(info.value)
    assert message.startswith("K2-baseline failed: job 2 hung: no result")
    assert "job timeout 0.3 s" in message and "still running" in message
    assert f"kept 1 run folder under {root}" in message and "\n" not in message
    config = json.loads((root / "K2-baseline" / "config.json").read_text())
    assert config["status"] == "failed" and config["job_timeout_s"] == 0.3
    assert config["stop_reason"].startswith("job 2 hung")
    assert _status(root / "K2-baseline") == "failed"
    assert not (root / "K2-speculative").exists()
    deadline = time.perf_counter() + 5
    while any(t.name == "latsim-generator" for t in threading.enumerate()):
        assert time.perf_counter() < deadline, "the stalled worker was not released"
        time.sleep(0.01)


def test_the_driver_fails_a_hung_job_and_closes_an_executor_it_cannot_join():
    """The driver alone, with an executor whose second job blocks until it is closed."""

    class Blocking:
        def __init__(self):
            self.closed = threading.Event()

        def run_job(self, job):
            start = time.perf_counter()
            if job.job_id == 2:
                self.closed.wait(60)
                raise RuntimeError("abandoned")
            time.sleep(C)
            return JobTiming(job.job_id, job.kind, job.length, job.branch, job.version, 0,
                             start, time.perf_counter(), None, 0, 0)

        def close(self):
            self.closed.set()

    executor = Blocking()
    config = ControllerConfig(Timing(2, 4, 32.0), BASELINE, 0.05)
    driver = LiveDriver(config, executor, Trace("t", (), 3.0),
                        DriverConfig(3.0, job_timeout_s=0.25))
    result = driver.run()
    assert result.failed and result.status == "failed" and result.worker_alive
    assert result.stop_reason.startswith("job 2 hung") and result.end_time < 2.5
    assert executor.closed.is_set()
    assert result.records.status == "interrupted"  # records: partial


def test_a_slow_job_within_the_timeout_completes_and_counts_in_c(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "slow@2:0.15/K2-baseline")
    root = tmp_path / "runs"
    results = measure(_config(root, policies=("baseline",), lead=0.05), generator=FakeGenerator())
    driver = results[0].driver
    assert driver.status == "complete" and _status(root / "K2-baseline") == "complete"
    job2 = next(j for j in driver.jobs if j.job_id == 2)
    assert job2.wall_s >= 0.15
    config = json.loads((root / "K2-baseline" / "config.json").read_text())
    assert config["job_timeout_s"] == default_job_timeout(0.05) == 5.05


def test_the_default_job_timeout():
    assert default_job_timeout(0.03) == pytest.approx(5.03)
    assert default_job_timeout(1.0) == 10.0 and default_job_timeout(3.7) == 37.0


# ---------------------------------------------------------------- the lead's margin


def test_the_live_lead_margin_covers_the_measured_jitter():
    """max(10 %, 5 ms) was below the measured slot-start lateness p99 (6.8 ms): the margin
    is now at least p99 lateness + p99 dispatch delay of the calibration pass."""
    lateness = [0.0001] * 98 + [0.0068, 0.0068]
    dispatch = [0.0002] * 99 + [0.001]
    assert LIVE.jitter(lateness, dispatch) == pytest.approx(0.0078)
    assert LIVE.margin(0.03, 0.0078) == pytest.approx(0.0078)  # not max(3 ms, 5 ms)
    assert LIVE.margin(0.2, 0.0078) == pytest.approx(0.02)  # 10 % still rules long jobs
    assert LIVE.margin(0.03) == pytest.approx(0.005)
    from latsim.model.lead import SIMULATED

    assert SIMULATED.jitter(lateness, dispatch) == 0.0  # the simulator has no jitter
    with pytest.raises(LatsimError, match="jitter"):
        LIVE.margin(0.03, float("nan"))


def test_choose_lead_takes_the_margin_from_the_calibration_pass():
    from harness.live.lead import Warmup

    warm = Warmup(2, 0, tuple(JobTiming(-i, "refill", 2, 2, 0, 0, 0.0, 0.03, None, 0, 0)
                              for i in range(1, 4)))
    cal = Calibration((0.031, 0.032), (0.0001, 0.0068), (0.0002, 0.001))
    choice = choose_lead(LIVE, [warm], cal)
    assert choice.jitter_s == pytest.approx(0.0078)
    assert choice.lead == pytest.approx(0.032 + 0.0078)
    assert "jitter 7.800 ms" in choice.source and "slot-start lateness" in choice.source
    plain = choose_lead(LIVE, [warm])
    assert plain.jitter_s is None and plain.lead == pytest.approx(0.035)


def test_a_measurement_records_where_its_margin_came_from(tmp_path):
    root = tmp_path / "runs"
    results = measure(_config(root, policies=("baseline",), calibration_jobs=3),
                      generator=FakeGenerator())
    config = json.loads((root / "K2-baseline" / "config.json").read_text())
    assert config["lead_jitter_s"] is not None and config["lead_jitter_s"] >= 0
    assert "jitter" in config["lead_source"] and "in-run calibration" in config["lead_source"]
    assert config["lead"] == results[0].summary["lead"]
    assert config["lead"] >= 0.01 + LIVE.margin(0.01, config["lead_jitter_s"]) - 1e-9


# ---------------------------------------------------------------- writing


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no filename, as a full disk


def test_every_harness_write_names_its_path(tmp_path, monkeypatch):
    from harness.measure.folder import save_json, write_rows

    target = tmp_path / "gen_jobs.csv"
    monkeypatch.setattr(Path, "open", _enospc)
    with pytest.raises(LatsimError) as info:
        write_rows(target, ["a"], [[1]])
    assert str(info.value) == f"cannot write {target}: No space left on device"
    monkeypatch.undo()
    monkeypatch.setattr(os, "replace", _enospc)
    with pytest.raises(LatsimError, match=f"cannot write {tmp_path / 's.json'}: No space"):
        save_json(tmp_path / "s.json", {})
    with pytest.raises(LatsimError, match="cannot write /nonexistent/x: "), \
            writing("/nonexistent/x"):
        open("/nonexistent/x", "w")  # noqa: SIM115


@pytest.fixture
def full_disk_at_summary(monkeypatch):
    """The disk fills up when summary.json is put in place."""
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "summary.json":
            _enospc()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_full_disk_at_the_summary_leaves_an_incomplete_folder(tmp_path, full_disk_at_summary):
    root = tmp_path / "runs"
    with pytest.raises(LatsimError) as info:
        measure(_config(root, policies=("baseline",), lead=0.05), generator=FakeGenerator())
    summary = root / "K2-baseline" / "summary.json"
    assert str(info.value) == f"cannot write {summary}: No space left on device"
    assert _status(root / "K2-baseline") == "incomplete"


def test_the_summary_is_written_before_the_telemetry_files(tmp_path, monkeypatch):
    real_open = Path.open

    def open_(self, *args, **kwargs):
        if self.name in ("gen_jobs.csv", ".gen_jobs.partial.csv"):  # in place or beside
            _enospc()
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)
    root = tmp_path / "runs"
    with pytest.raises(LatsimError, match="cannot write .*gen_jobs.csv: No space left"):
        measure(_config(root, policies=("baseline",), lead=0.05), generator=FakeGenerator())
    folder = read_run_folder(root / "K2-baseline")
    assert folder.summary["status"] == "complete"  # the summary made it to disk
    assert folder.status == "incomplete"  # config.json still says running


def test_records_that_cannot_be_written_fail_the_run_with_the_path(tmp_path, monkeypatch):
    import harness.live.recorder

    real = harness.live.recorder.write_csv

    def write_csv(path, record_type, records, **kw):
        if records:  # the headers are written; the first rows hit a full disk
            _enospc()
        return real(path, record_type, records, **kw)

    monkeypatch.setattr(harness.live.recorder, "write_csv", write_csv)
    errors: list[str] = []
    writer = RecordWriter(tmp_path, (), flush_every_s=0.01, on_error=errors.append)
    writer.start()
    from latsim.controller.records import StallRecord

    writer(StallRecord(1, 0.0, 0.1, False))
    writer.close()
    assert writer.error == errors[0] == (f"cannot write {tmp_path / 'stalls.csv'}: "
                                         "No space left on device")
    root = tmp_path / "runs"
    with pytest.raises(LatsimError) as info:
        measure(_config(root, policies=("baseline",), lead=0.05), generator=FakeGenerator())
    assert str(info.value).startswith(f"K2-baseline failed: cannot write {root / 'K2-baseline'}")
    assert "No space left on device" in str(info.value)
    assert _status(root / "K2-baseline") == "failed"


def test_the_cli_error_for_a_full_disk_names_the_file(tmp_path, monkeypatch, full_disk_at_summary):
    monkeypatch.setattr(harness.measure.run, "build_generator",
                        lambda name, config: FakeGenerator())
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["measure", "--K", "2", "--fps", "32", "--duration", "0.6",
                                      "--rate", "0", "--policy", "baseline", "--lead", "0.05",
                                      "--warmup", "2", "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        f"latsim: error: cannot write {out / 'K2-baseline' / 'summary.json'}: "
        "No space left on device")


def test_an_unwritable_out_fails_before_any_work(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    gen = FakeGenerator()
    with pytest.raises(LatsimError, match=f"--out {blocker / 'runs'}: cannot write there"):
        measure(_config(blocker / "runs"), generator=gen)
    assert not gen.threads_seen  # no warm-up, no calibration

    import harness.measure.profile

    monkeypatch.setattr(harness.measure.profile, "build_generator", lambda *a: pytest.fail("built"))
    runner = CliRunner()
    for out, message in ((blocker / "p.json", "cannot write there"),
                         (tmp_path, "is a folder")):
        result = runner.invoke(app, ["profile", "--K", "1", "--out", str(out)])
        assert result.exit_code == 2 and message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1


# ---------------------------------------------------------------- profile


def _profile_config(**kw):
    from harness.measure.profile import ProfileConfig
    from latsim.plugins import GeneratorConfig

    return ProfileConfig(GeneratorConfig(), (1, 3), **{"jobs_per_kind": 2, "gap_s": 0.0, **kw})


def test_an_interrupted_profile_keeps_its_jobs_beside_the_output(tmp_path, monkeypatch):
    from harness.measure.profile import run_profile

    out = tmp_path / "profile.json"
    monkeypatch.setenv(FAULT_ENV, "sigint@3/profile-K3")
    with pytest.raises(Interrupted) as info:
        run_profile(_profile_config(), out, generator=FakeGenerator(0.001))
    partial = tmp_path / "profile.partial.json"
    assert str(info.value) == (f"kept 6 of 8 timed jobs in {partial} (status interrupted; "
                               f"{out} not written): stopped by Ctrl-C")
    assert not out.exists()
    document = json.loads(partial.read_text())
    assert document["status"] == "interrupted"
    assert {k: {kind: len(v) for kind, v in kinds.items()}
            for k, kinds in document["costs"].items()} == {
        "1": {"refill": 2, "replan": 2}, "3": {"refill": 1, "replan": 1}}
    monkeypatch.setenv(FAULT_ENV, "sigterm@1/profile-K1")
    with pytest.raises(Interrupted, match="kept nothing: stopped by SIGTERM"):
        run_profile(_profile_config(), out, generator=FakeGenerator(0.001))
    monkeypatch.delenv(FAULT_ENV)
    document = run_profile(_profile_config(), out, generator=FakeGenerator(0.001))
    written = json.loads(out.read_text())
    assert written["status"] == document["status"] == "complete"
    assert written["costs"] == document["costs"]


def test_profile_bounds_its_work():
    for kw, message in (({"gap_s": float("nan")}, "--gap must be >= 0 and <= 10 s"),
                        ({"gap_s": 1e9}, "--gap must be >= 0 and <= 10 s"),
                        ({"jobs_per_kind": 10**9}, "--jobs must be a positive integer <= 5000"),
                        ({"jobs_per_kind": 5000, "gap_s": 1.0}, "idle gaps")):
        with pytest.raises(LatsimError, match=message.replace("[", r"\[")):
            _profile_config(**kw)


# ---------------------------------------------------------------- real processes (slow)


def _start_cli(args: list[str], tmp_path: Path) -> subprocess.Popen:
    latsim = Path(sys.executable).with_name("latsim")
    return subprocess.Popen([str(latsim), *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_run(proc: subprocess.Popen, run_dir: Path, timeout: float = 120.0) -> None:
    """Until the run has started: config.json says running and a job has been recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        jobs = run_dir / "jobs.csv"
        if jobs.is_file() and len(jobs.read_text().splitlines()) > 2:
            return
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the run did not start")


MEASURE = ["measure", "--preset", "tiny", "--K", "2", "--fps", "32", "--duration", "30",
           "--rate", "1", "--lead", "0.1", "--warmup", "1", "--policy", "baseline"]


@pytest.mark.slow
def test_sigkill_mid_run_leaves_a_folder_that_reads_incomplete(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "runs"
    proc = _start_cli([*MEASURE, "--out", str(out)], tmp_path)
    _wait_for_run(proc, out / "K2-baseline")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    folder = read_run_folder(out / "K2-baseline")
    assert folder.config["status"] == "running" and folder.status == "incomplete"
    assert folder.records("jobs")


@pytest.mark.slow
def test_sigterm_mid_run_keeps_the_run_and_exits_130(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "runs"
    proc = _start_cli([*MEASURE, "--out", str(out)], tmp_path)
    _wait_for_run(proc, out / "K2-baseline")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "latsim: interrupted" in stderr.splitlines()[-1]
    folder = read_run_folder(out / "K2-baseline")
    assert folder.status == "interrupted" and folder.summary["stop_reason"] == "SIGTERM"
    assert json.loads((out / "measure.json").read_text())["interrupted"] is True


def test_a_stopped_runs_summary_is_taken_over_the_window_it_covers(tmp_path):
    """A run stopped at about a third of its window: stall %, busy % and the rest are over
    [0, end_time], as compare takes them, and the summary says so."""
    from dataclasses import replace

    from latsim.analysis.metrics import summarize

    gen = FakeGenerator(c=0.03)

    def arm(driver: LiveDriver) -> None:
        def stop_at_job_4(job):
            if job.job_id == 4:
                driver.stop("test stop")

        gen.hook = stop_at_job_4

    (result,) = measure(_config(tmp_path / "runs", policies=("baseline",), lead=0.05,
                                duration=3.0), generator=gen, on_driver=arm)
    driver = result.driver
    assert driver.status == "interrupted" and driver.end_time < 3.0
    summary = result.summary
    expected = summarize([replace(driver.records, duration=driver.end_time)])
    assert summary["window_s"] == pytest.approx(driver.end_time)
    assert summary["stall_pct"] == pytest.approx(expected.stall_pct)
    assert summary["busy_pct"] == pytest.approx(expected.busy_pct)
    assert summary["metrics_window"].startswith("partial: [0, ")
    assert summary["duration"] == 3.0  # what was asked for stays in the identity
