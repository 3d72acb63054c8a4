"""latsim grid and the schedulers: grid files, cell order, byte-identical results on every
scheduler (local in process, local processes, a Dask LocalCluster started here), resume
after an interruption, and a Dask worker killed mid-grid."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from latsim.errors import LatsimError
from latsim.experiments.engine import Experiment, run_experiment
from latsim.experiments.executors import check_scheduler, using
from latsim.experiments.grid import PARTIAL, load_grid, parse_grid, run_grid

distributed = pytest.importorskip("distributed")

GRID = """
name = "small"
seeds = 3
seed = 7
metrics = ["L50", "L95", "stall_pct", "w"]

[fixed]
duration = {duration}

[axes]
K = [4, 8]
policy = ["baseline", "speculative"]
rate = {rates}
"""


def _grid(tmp_path: Path, duration: float = 60, rates: str = "[0.05, 0.2]") -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(duration=duration, rates=rates))
    return path


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded Dask worker processes, started inside the test run."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as local:
        yield local


def test_grid_file_errors_are_one_line(tmp_path):
    cases = {
        "K = [1": "not valid TOML",
        "[axes]\nK = [4]\nbogus = [1]": "unknown setting 'bogus'",
        "[axes]\nK = ['4']": "K = '4' is not a integer",
        "[axes]\nK = [4]\n[fixed]\nK = 8": "both an axis and fixed",
        "[axes]\nK = [4]\nC = [0.5]\n[fixed]\ncost = 'fixed:1'": "C or cost",
        "[axes]\nrate = [0.1]": "K must be an axis or fixed",
        "[axes]\nK = []": "non-empty list",
        "[axes]\nK = [4, 4]": "repeats",
        "seeds = 0\n[axes]\nK = [4]": "seeds",
        "extra = 1\n[axes]\nK = [4]": "unknown key",
        "[axes]\nK = [4]\npolicy = ['fast']": "unknown policy",
        "[axes]\nK = " + str(list(range(1, 400))) + "\nrate = "
        + str([0.01 * i for i in range(1, 400)]): "at most",
    }
    for text, message in cases.items():
        with pytest.raises(LatsimError, match=message):
            parse_grid(text)
    with pytest.raises(LatsimError, match="scheduler"):
        check_scheduler("tcp://nowhere")


def test_cells_are_the_product_in_file_order_last_axis_fastest(tmp_path):
    spec = load_grid(_grid(tmp_path))
    assert spec.n_cells == 8
    assert [spec.cell(i) for i in (0, 1, 2, 7)] == [
        {"K": 4, "policy": "baseline", "rate": 0.05},
        {"K": 4, "policy": "baseline", "rate": 0.2},
        {"K": 4, "policy": "speculative", "rate": 0.05},
        {"K": 8, "policy": "speculative", "rate": 0.2},
    ]


def test_unknown_metric_names_what_a_cell_has(tmp_path):
    spec = parse_grid('metrics = ["L42"]\n[axes]\nK = [4]\n[fixed]\nduration = 30')
    with pytest.raises(LatsimError, match="unknown metric.*L95"):
        run_grid(spec, tmp_path / "out")


def test_every_scheduler_gives_the_same_bytes(tmp_path, cluster):
    spec = load_grid(_grid(tmp_path))
    outs = {}
    for name, scheduler, jobs in (("inline", "local", 1), ("procs", "local", 2),
                                  ("dask", cluster.scheduler_address, 2)):
        result = run_grid(spec, tmp_path / name, scheduler, jobs)
        assert result.status == "complete" and result.ran == 8
        outs[name] = (tmp_path / name / "cells.csv").read_bytes()
    assert outs["inline"] == outs["procs"] == outs["dask"]
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(tmp_path / "dask" / "cells.parquet").to_pylist()
    assert [row["cell"] for row in table] == list(range(8))
    # sweep too: one experiment on the cluster equals the local run
    experiment = Experiment(Ks=(4, 8), seeds=4, duration=60.0)
    local = run_experiment(experiment, jobs=1).rows
    with using(cluster.scheduler_address):
        remote = run_experiment(experiment, jobs=1).rows
    assert json.dumps(local, default=str) == json.dumps(remote, default=str)


def test_dask_local_beside_a_busy_http_port_says_nothing_and_gives_the_local_rows():
    """Another cluster (here a socket) holds Dask's default HTTP port, 8787: a
    ``--scheduler dask-local`` run takes a free port without a warning (four lines on
    stderr, one past 80 columns) and gives the rows of a run in process."""
    import socket
    import warnings

    experiment = Experiment(Ks=(4,), seeds=2, duration=20.0)
    local = run_experiment(experiment, jobs=1).rows
    with socket.socket() as held:
        try:
            held.bind(("", 8787))
            held.listen()
        except OSError:
            pass  # something holds it already
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with using("dask-local", 2):
                remote = run_experiment(experiment, jobs=2).rows
    assert not [w for w in caught if "already in use" in str(w.message)], caught
    assert json.dumps(local, default=str) == json.dumps(remote, default=str)


def test_an_interrupted_grid_resumes_without_rerunning_cells(tmp_path):
    spec = load_grid(_grid(tmp_path))
    reference = run_grid(spec, tmp_path / "ref").rows

    def stop_after_three(done: int, total: int) -> None:
        if done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(spec, tmp_path / "cut", progress=stop_after_three)
    meta = json.loads((tmp_path / "cut" / "grid.json").read_text())
    done = meta["done"]  # the cells of the batches that came back (batches of 2 here)
    assert meta["status"] == PARTIAL and 3 <= done < 8
    assert len((tmp_path / "cut" / "cells.csv").read_text().splitlines()) == 1 + done
    resumed = run_grid(spec, tmp_path / "cut")
    assert resumed.ran == 8 - done and resumed.status == "complete"
    assert resumed.rows == reference
    assert ((tmp_path / "cut" / "cells.csv").read_bytes()
            == (tmp_path / "ref" / "cells.csv").read_bytes())
    # a kill mid-write leaves a torn last line: dropped on resume, the row run again
    lines = tmp_path / "cut" / "cells.jsonl"
    kept = lines.read_text().splitlines()
    lines.write_text("\n".join(kept[:-1]) + "\n" + kept[-1][: len(kept[-1]) // 2])
    again = run_grid(spec, tmp_path / "cut")
    assert again.ran == 1 and again.rows == reference
    complete = [line for line in lines.read_text().splitlines() if line.endswith("}")]
    assert sorted(json.loads(line)["cell"] for line in complete) == list(range(8))
    assert ((tmp_path / "cut" / "cells.csv").read_bytes()
            == (tmp_path / "ref" / "cells.csv").read_bytes())
    default = parse_grid("[axes]\nK = [4]\n[fixed]\nduration = 30")  # default metrics
    (row,) = run_grid(default, tmp_path / "default").rows
    # speculative by default; A among the default metrics: the cell asks for the baseline
    assert row["dit_calls"] > 0 and row["A"] >= 1.0
    other = parse_grid("[axes]\nK = [4]\n[fixed]\nduration = 30")
    with pytest.raises(LatsimError, match="holds another grid"):
        run_grid(other, tmp_path / "cut")


def test_a_grid_another_live_process_is_writing_is_not_resumed_under_it(tmp_path):
    import socket
    import subprocess
    import sys

    spec = load_grid(_grid(tmp_path))
    run_grid(spec, tmp_path / "g")
    meta_path = tmp_path / "g" / "grid.json"
    meta = json.loads(meta_path.read_text())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        writer = {"pid": other.pid, "host": socket.gethostname()}
        meta_path.write_text(json.dumps({**meta, "status": "running", "writer": writer}))
        with pytest.raises(LatsimError, match=f"process {other.pid} on this host is still"):
            run_grid(spec, tmp_path / "g")
    finally:
        other.kill()
        other.wait()
    assert run_grid(spec, tmp_path / "g").status == "complete"  # its writer is gone


def test_a_worker_killed_mid_grid_loses_no_cell(tmp_path, cluster):
    spec = load_grid(_grid(tmp_path, duration=400, rates="[0.02, 0.05, 0.1, 0.2]"))
    reference = run_grid(spec, tmp_path / "ref").rows
    client = distributed.Client(cluster)
    pids = client.run(os.getpid)
    client.close()
    lines = tmp_path / "dask" / "cells.jsonl"
    killed: list[int] = []

    def kill_one_when_started() -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            if lines.exists() and lines.read_text().count("\n") >= 1:
                pid = next(iter(pids.values()))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_when_started)
    killer.start()
    result = run_grid(spec, tmp_path / "dask", cluster.scheduler_address, 2)
    killer.join()
    assert killed, "the grid finished before a worker could be killed"
    assert result.status == "complete" and result.rows == reference
    cells = [json.loads(line)["cell"] for line in lines.read_text().splitlines()]
    assert sorted(cells) == list(range(spec.n_cells))  # each once: none lost, none twice


def test_damaged_files_in_out_are_one_line_errors_and_keep_the_finished_cells(tmp_path):
    """A binary grid file, a non-UTF-8 or foreign line in cells.jsonl and a truncated
    grid.json are refused in one line; the finished cells' table is left as it was."""
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(LatsimError, match="cannot read grid file"):
        load_grid(binary)
    spec = load_grid(_grid(tmp_path, duration=20, rates="[0.1]"))
    out = tmp_path / "out"
    run_grid(spec, out)
    table = (out / "cells.csv").read_bytes()
    lines = (out / "cells.jsonl").read_bytes()
    for damage, message in (
            (lines + b'{"garbage": true, "cell": 1}\n', "not a cell of this grid"),
            (lines + b"\xff\xfe\n", "cannot read"),
            (lines.replace(b'"cell": 0', b'"cell": 99'), "not a cell of this grid"),
            (b"not json\n" + lines, "not a JSON line")):
        (out / "cells.jsonl").write_bytes(damage)
        with pytest.raises(LatsimError, match=message) as info:
            run_grid(spec, out)
        assert "\n" not in str(info.value)
        assert (out / "cells.csv").read_bytes() == table
    (out / "cells.jsonl").write_bytes(lines + b'{"cell": 1, "K"')  # torn by a kill: resumes
    assert run_grid(spec, out).ran == 0
    (out / "grid.json").write_text('{"format": "latsim-gr')
    with pytest.raises(LatsimError, match="not a grid's record"):
        run_grid(spec, out)


def test_a_device_pipe_or_huge_file_in_out_is_refused_not_read(tmp_path):
    """A resume read cells.jsonl and grid.json whole: ``/dev/zero`` behind either grew
    to 24 GB before it was killed, and a named pipe hung. Both are refused in one line. A
    pipe where cells.csv goes was refused only once grid.json said "running" again (the
    folder fuzz found it): now before anything is written."""
    spec = load_grid(_grid(tmp_path, duration=20, rates="[0.1]"))
    out = tmp_path / "out"
    run_grid(spec, out)
    kept = {name: (out / name).read_bytes() for name in ("cells.jsonl", "grid.json",
                                                         "cells.csv")}
    for name in kept:
        (out / name).unlink()
        if os.path.exists("/dev/zero"):
            (out / name).symlink_to("/dev/zero")
            with pytest.raises(LatsimError, match="not a regular file"):
                run_grid(spec, out)
            (out / name).unlink()
        os.mkfifo(out / name)
        with pytest.raises(LatsimError, match="not a regular file"):
            run_grid(spec, out)
        (out / name).unlink()
        (out / name).write_bytes(kept[name])
        assert (out / "grid.json").read_bytes() == kept["grid.json"]  # nothing written
    assert run_grid(spec, out).ran == 0  # intact again: nothing left to run


def test_each_cell_carries_its_metrics_standard_errors_and_replications(tmp_path):
    """``{metric}_se`` is the spread of the metric over the cell's replications, each
    replication summarised alone (from the same runs as the pooled value)."""
    import math

    from latsim.experiments.engine import replication_rows
    from latsim.experiments.grid import experiment

    spec = load_grid(_grid(tmp_path, duration=30, rates="[0.2]"))
    assert not any(experiment(spec, i).twin for i in range(spec.n_cells))  # A not asked
    result = run_grid(spec, tmp_path / "out", "local", 1)
    for row in result.rows:
        assert row["n_runs"] == spec.seeds == 3
        per_run = replication_rows(run_experiment(experiment(spec, row["cell"]), jobs=1))
        for metric in spec.metrics:
            values = [r[metric] for r in per_run]
            mean = sum(values) / len(values)
            se = math.sqrt(sum((v - mean) ** 2 for v in values) / 2 / 3)
            assert row[f"{metric}_se"] == pytest.approx(se, abs=1e-12), metric
    baseline = [r for r in result.rows if r["policy"] == "baseline"]
    assert all(r["w_se"] == 0.0 for r in baseline)  # the baseline wastes nothing, ever
    with pytest.raises(LatsimError, match="format 'latsim-grid/1'"):
        meta = tmp_path / "out" / "grid.json"
        meta.write_text(meta.read_text().replace("latsim-grid/2", "latsim-grid/1"))
        run_grid(spec, tmp_path / "out", "local", 1)
