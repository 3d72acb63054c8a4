"""The extension points: registries filled from entry points, the built-ins registered as a
third party's would be, one-line errors for broken plug-ins, and a real third-party package
(the one docs/extending.md shows) installed and used through the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from latsim.errors import LatsimError
from latsim.model.costs import FixedCost
from latsim.plugins import (
    CostModel,
    available,
    build_generator,
    load_cost,
    load_schedule,
    plugins,
    registry,
)
from tests.helpers import row_of, rows_of

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- built-ins


def test_the_built_ins_are_registered_through_latsims_own_entry_points():
    assert set(available("costs")) >= {"fixed", "affine", "lognormal", "table", "usp", "sdvg",
                                       "draftverify", "waveforcing"}
    assert set(available("schedules")) >= {"fifo", "least-slack", "replan-first"}
    assert set(available("generators")) >= {"wan", "ltx", "sleep"}
    for plugin in plugins("costs") + plugins("schedules") + plugins("generators"):
        if plugin.target.startswith(("latsim.", "harness.")):
            assert plugin.distribution.startswith("latsim "), plugin


def test_load_cost_reads_every_built_in_prefix():
    assert load_cost("fixed:0.37") == FixedCost(0.37)
    for spec in ("affine:0.1,0.2", "lognormal:1,0.5", "draftverify:0.2,1.3,3.46",
                 "waveforcing:0.08,4,0.2"):
        model = load_cost(spec)
        assert isinstance(model, CostModel) and model.spec.split(":")[0] == spec.split(":")[0]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: load_cost("nope:1"), "unknown cost spec prefix 'nope'; registered: affine:"),
    (lambda: load_cost("fixed"), "needs the form KIND:ARGS"),
    (lambda: load_schedule("lifo"), "unknown schedule 'lifo'; registered: fifo, least-slack"),
    (lambda: build_generator("nope", None), "unknown generator 'nope'; registered: ltx, sleep"),
    (lambda: available("widgets"), "unknown kind of plug-in 'widgets'"),
])
def test_unknown_names_are_one_line_errors_listing_what_is_registered(call, message):
    with pytest.raises(LatsimError, match=re.escape(message)) as info:
        call()
    assert "\n" not in str(info.value)


def test_discovery_is_lazy_and_loading_the_registries_imports_no_torch():
    code = textwrap.dedent("""
        import sys
        import latsim.cli, latsim.plugins
        from latsim.plugins import registry
        lazy = registry._found is None
        latsim.plugins.load_cost("fixed:1"); latsim.plugins.load_schedule("least-slack")
        latsim.plugins.load_generator("sleep"); latsim.plugins.load_generator("wan")
        print(lazy, "torch" in sys.modules, "diffusers" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["True", "False", "False"]


# ---------------------------------------------------------------- broken plug-ins


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Install (by hand: a dist-info folder on sys.path) a distribution ``broken-plugins``
    whose entry points point at ``broken_plugins.py``; returns a function that writes the
    module and the entry points."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(module: str, entries: dict[str, dict[str, str]]) -> None:
        (tmp_path / "broken_plugins.py").write_text(textwrap.dedent(module))
        info = tmp_path / "broken_plugins-0.3.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\n"
                                       "Version: 0.3\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items())
            for group, names in entries.items()))
        sys.modules.pop("broken_plugins", None)
        registry.refresh()

    yield install
    sys.modules.pop("broken_plugins", None)
    registry.refresh()


def test_a_plug_in_that_fails_to_import_is_named_with_its_distribution(fake_distribution):
    fake_distribution("raise ImportError('needs the frobnicator')\n",
                      {"latsim.costs": {"frob": "broken_plugins:make"}})
    with pytest.raises(LatsimError) as info:
        load_cost("frob:1")
    assert str(info.value) == (
        "cost model 'frob' (broken_plugins:make, from broken-plugins 0.3) failed to import: "
        "ImportError: needs the frobnicator")


def test_a_plug_in_returning_the_wrong_type_or_raising_is_one_line(fake_distribution):
    fake_distribution("""
        def make(args):
            return 0.37
        def crash(args):
            raise ZeroDivisionError('oops')
        class Config:
            pass
        def generator(config):
            return Config()
    """, {"latsim.costs": {"float": "broken_plugins:make", "crash": "broken_plugins:crash"},
          "latsim.generators": {"empty": "broken_plugins:generator"}})
    with pytest.raises(LatsimError, match=r"^cost model 'float' \(broken_plugins:make, from "
                       r"broken-plugins 0\.3\) returned a float, not a cost model"):
        load_cost("float:1")
    with pytest.raises(LatsimError, match=r"^cost model 'crash' .* failed: ZeroDivisionError"):
        load_cost("crash:1")
    with pytest.raises(LatsimError, match=r"generator 'empty' .* returned a Config, not a live "
                       "generator"):
        build_generator("empty", None)


def test_a_name_two_distributions_register_is_refused(fake_distribution):
    fake_distribution("def make(args):\n    return None\n",
                      {"latsim.costs": {"fixed": "broken_plugins:make"}})
    with pytest.raises(LatsimError, match="cost model 'fixed' is registered by broken-plugins "
                       "0.3 and by latsim .*; uninstall one"):
        load_cost("fixed:1")


def test_a_schedule_that_returns_a_stranger_fails_the_simulation_in_one_line(
        fake_distribution):
    fake_distribution("def stranger(waiting, now):\n    return object()\n",
                      {"latsim.schedules": {"stranger": "broken_plugins:stranger"}})
    from typer.testing import CliRunner

    from latsim.cli import app

    result = CliRunner().invoke(app, ["simulate", "--K", "8", "--C", "0.9", "--streams", "3",
                                      "--pools", "dit=1", "--schedule", "stranger",
                                      "--seeds", "1", "--duration", "20"])
    assert result.exit_code == 2, result.output
    assert result.stderr == ("latsim: error: schedule broken_plugins:stranger returned "
                             "something that is not a waiting task\n")


# ---------------------------------------------------------------- a third-party package


def _readme_package(root: Path) -> Path:
    """The package docs/extending.md shows, written out under ``root``."""
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text[text.index("## Extending latsim"):]
    blocks = re.findall(r"```(?:toml|python)\n# (\S+)\n(.*?)```", section, re.S)
    assert [Path(path).name for path, _ in blocks] == ["pyproject.toml",
                                                       "my_latsim_plugins.py"]
    for path, body in blocks:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    return root / Path(blocks[0][0]).parent


@pytest.fixture(scope="module")
def third_party(tmp_path_factory):
    """The README's package built and installed (pip, into a folder of its own), and the
    environment that puts it on the path of a ``latsim`` subprocess."""
    root = tmp_path_factory.mktemp("plugin")
    package = _readme_package(root)
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(package)],
                   check=True, capture_output=True)
    return {**os.environ, "PYTHONPATH": str(site)}


def _latsim(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from latsim.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT)


def test_the_readme_package_is_listed_with_its_distribution(third_party):
    out = _latsim(third_party, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    listed = {(p["kind"], p["name"]): p["distribution"] for p in rows_of(out.stdout)}
    for key in (("costs", "const"), ("schedules", "lifo"), ("generators", "nap")):
        assert listed[key] == "my-latsim-plugins 0.1"


def test_a_plug_in_cost_gives_the_same_numbers_as_the_built_in_it_equals(third_party):
    def run(spec: str) -> list[dict]:
        out = _latsim(third_party, "simulate", "--K", "8", "--cost", spec, "--seeds", "3",
                      "--json")
        assert out.returncode == 0, out.stderr
        return rows_of(out.stdout)

    plug, built_in = run("const:0.37"), run("fixed:0.37")
    assert [row.pop("cost") for row in plug] == ["const:0.37"] * 2
    assert [row.pop("cost") for row in built_in] == ["fixed:0.37"] * 2
    assert plug == built_in


def _served_last_in(tasks_csv: Path) -> tuple[int, int, int]:
    """(picks of a DiT task that waited while others waited too, those that took the one
    queued last, those that took the one queued first), from the task records of a run on
    one device. A pick among tasks queued at the same latest instant is left out: their
    times cannot say which came last."""
    import pandas as pd

    tasks = pd.read_csv(tasks_csv)
    tasks = tasks[tasks.stage == "dit"]
    picks = last = first = 0
    for start, enqueued in zip(tasks.t_start, tasks.t_enqueue, strict=True):
        if not enqueued < start:
            continue  # it did not wait: nothing was chosen
        others = tasks[(tasks.t_enqueue < start) & (tasks.t_start > start)]
        if len(others):
            latest = max(enqueued, others.t_enqueue.max())
            if (others.t_enqueue == latest).sum() + (enqueued == latest) > 1:
                continue
            picks += 1
            last += bool(enqueued == latest)
            first += bool(enqueued < others.t_enqueue.min())
    return picks, last, first


def test_a_plug_in_schedule_serves_the_task_queued_last(third_party, tmp_path):
    counts = {}
    for schedule in ("lifo", "fifo"):
        out = _latsim(third_party, "simulate", "--K", "8", "--C", "0.45", "--streams", "4",
                      "--pools", "dit=1", "--schedule", schedule, "--seeds", "1",
                      "--duration", "30", "--policy", "speculative", "--updates",
                      "poisson:0.3", "--out", str(tmp_path / schedule))
        assert out.returncode == 0, out.stderr
        tasks = tmp_path / schedule / "tasks.csv"
        counts[schedule] = _served_last_in(tasks)
    picks, last, first = counts["lifo"]
    print("lifo picks, the last queued, the first queued:", picks, last, first)
    # the plug-in's pick, except where it would overtake a task for a stream's second
    # time: the share bound (latsim.plugins.take_next) takes the first waiting instead
    assert picks >= 10 and last >= picks / 2 and last + first == picks
    fifo_picks, fifo_last, fifo_first = counts["fifo"]
    assert fifo_picks >= 10 and fifo_first == fifo_picks  # FIFO takes the oldest


def test_a_plug_in_generator_runs_a_live_measurement(third_party, tmp_path):
    out = _latsim(third_party, "measure", "--generator", "nap", "--generator-option",
                  "seconds=0.05", "--K", "2", "--duration", "2", "--rate", "0",
                  "--policy", "baseline", "--lead", "0.2", "--warmup", "3", "--calibrate", "0",
                  "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    summary = row_of(out.stdout)
    assert summary["cost"] == "live:nap:0.05" and summary["generator"] == "nap"
    assert 0.05 <= summary["C_p50"] < 0.05 + 0.05  # a 50 ms nap, plus the OS's wake-up
    config = json.loads((tmp_path / "K2-baseline" / "config.json").read_text())
    assert config["generator"]["name"] == "nap" and config["r"] == 4
