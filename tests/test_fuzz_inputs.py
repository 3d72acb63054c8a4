"""Fuzz the input edges: the spec parsers, the trace parser and the command line.

Properties (issue "Reliability", "Bounded inputs"):

- ``load_cost`` / ``parse_updates`` return a model or raise :class:`LatsimError`, nothing
  else, and a model they return gives finite numbers;
- ``validate_trace`` / ``load_trace`` on random text and random bytes agree (no problems iff
  the trace loads), every problem is one line, and a loaded trace is sorted, finite, >= 0
  and inside its declared duration;
- every command (``simulate``, ``sweep``, ``theory``, ``traces generate|validate|show``,
  ``reproduce``) given random option values (the float edges nan, inf, -0.0, 1e308, 5e-324,
  huge integers, random text) exits 0 or 2 (1 only where a command documents it), prints
  exactly one ``latsim: error: ...`` line on stderr when it exits 2, never a traceback, and
  finishes within :func:`hang_bound` seconds.

Work is kept small so an accepted run is quick: ``--duration 5 --seeds 2`` and
``--max-events 20000`` by default (any run the bound admits takes well under a second), and
``--max-events`` is fuzzed only alone. The time bound is not a performance assertion: it is
derived from a baseline measured here (:func:`hang_bound`: 100 x the baseline, at least
20 s), so only a hang fails it; an alarm turns a real hang into a failure instead of a stuck
test run. The default tier runs a few examples per test (a few seconds); the ``slow`` tier
runs many more.
"""

from __future__ import annotations

import math
import signal
import statistics
import time
import warnings
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from latsim.cli.root import app
from latsim.errors import LatsimError
from latsim.model.arrivals import parse_updates
from latsim.model.traces import load_trace, validate_trace
from latsim.model.workload import parse_activity, parse_arrivals, parse_duration
from latsim.plugins import available, load_cost
from tests.helpers import envelope_of, row_of

runner = CliRunner()

#: Examples per test in the default tier and in the slow tier.
FAST, SLOW = 15, 150
TIERS = [pytest.param(FAST, id="fast"),
         pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]

#: No invocation here may take longer than this, whatever the baseline (only a hang does).
HANG_FLOOR_S = 20.0


# ---------------------------------------------------------------- strategies

EDGE_NUMBERS = [
    "nan", "-nan", "inf", "-inf", "Infinity", "-0.0", "0", "0.0", "1e308", "-1e308", "1.8e308",
    "5e-324", "-5e-324", "1e-9", "1e9", "1e6", "86400", "86401", "4096", "4097",
    str(2**63 - 1), str(2**63), str(2**64), str(10**30), "-" + str(10**30), str(10**400),
    "-1", "1", "2", "3", "4", "8", "0.5", "0x10", "1_000", " 7 ", "",
]

#: Random text as a command line could carry it (no NUL, which argv cannot hold).
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)

numbers = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.floats().map(repr),
    st.integers(-(2**80), 2**80).map(str),
    st.integers(-3, 40).map(str),
    st.floats(0, 100).map(repr),  # plausible values, to reach the runs themselves
    text,
)

#: Every registered cost prefix, with one to four numbers of any kind (its own count among
#: them), so each prefix's reader meets every number the others meet.
cost_specs = st.one_of(
    st.builds(lambda kind, args: f"{kind}:{','.join(args)}",
              st.sampled_from(available("costs")), st.lists(numbers, min_size=1, max_size=4)),
    st.sampled_from(["table:/dev/zero", "table:/", "table:", "fixed:", "affine:1",
                     "lognormal:1,2,3", "gamma:1", "usp:/dev/null@2", "sdvg:/"]),
    text,
)

#: A fleet workload's session arrivals, durations and activity (:mod:`latsim.model.workload`).
workload_specs = st.one_of(
    st.builds(lambda kind, args: f"{kind}:{','.join(args)}",
              st.sampled_from(["poisson", "mmpp", "population", "fixed", "exponential",
                               "lognormal", "pareto", "active_idle"]),
              st.lists(numbers, min_size=1, max_size=4)),
    st.sampled_from(["curve:/dev/zero", "curve:/", "always", "poisson", "population:"]),
    text,
)

update_specs = st.one_of(
    st.builds(lambda kind, a: f"{kind}:{a}", st.sampled_from(["poisson", "bernoulli"]),
              numbers),
    st.sampled_from(["trace:/dev/zero", "trace:/", "traces:/", "traces:/dev/null",
                     "trace:/nonexistent.jsonl", "poisson:", "storm:1"]),
    text,
)


def trace_line(draw_number: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """One line of a trace as a fuzzer writes it: conditions, headers, junk."""
    return st.one_of(
        st.builds(lambda t: f'{{"t": {t}}}', draw_number),
        st.builds(lambda d: f'{{"meta": {{"duration": {d}}}}}', draw_number),
        st.sampled_from(['{"meta": 1}', '{"t": true}', '{"t": "1"}', "[1]", "null", "{",
                         '{"version": 2}', "", "   ", '{"t": NaN}', '{"t": -Infinity}',
                         "[" * 2000]),
        text,
    )


json_numbers = st.one_of(
    st.sampled_from(["0", "1", "2.5", "59.999", "60", "1e308", "1e999", "-1", "-0.0",
                     "5e-324", "1" * 400, "1" * 5000, "NaN", "Infinity"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(2**70), 2**70).map(str),
)
trace_texts = st.lists(trace_line(json_numbers), max_size=8).map("\n".join)


# ---------------------------------------------------------------- timing guard


class Hang(Exception):
    """Raised by the alarm in :func:`bounded` (an ordinary exception, so the command line's
    Ctrl-C handling does not swallow it)."""


@contextmanager
def bounded(seconds: float):
    """Fail with :class:`Hang` after ``seconds`` instead of hanging the test run."""

    def ring(signum, frame):
        raise Hang(f"no answer after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


BASE_SIMULATE = {"--K": "4", "--C": "0.2", "--duration": "5", "--seeds": "2", "--jobs": "1",
                 "--max-events": "20000"}


def _flatten(options: dict[str, str | list[str]]) -> list[str]:
    args: list[str] = []
    for name, value in options.items():
        for one in value if isinstance(value, list) else [value]:
            args += [name, one]
    return args


@cache
def hang_bound() -> float:
    """100 x the median time of a small valid ``simulate`` (measured here, so a slow or
    loaded machine gets a proportionally larger bound), and at least :data:`HANG_FLOOR_S`."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        result = runner.invoke(app, ["simulate", *_flatten(BASE_SIMULATE), "--json"])
        times.append(time.perf_counter() - started)
        assert result.exit_code == 0, result.stderr
    return max(HANG_FLOOR_S, 100 * statistics.median(times))


def invoke_checked(args: list[str], allowed: tuple[int, ...] = (0, 2)):
    """Run the command line; check the exit code, the one-line error and the time."""
    bound = hang_bound()
    started = time.perf_counter()
    with bounded(bound + 10):
        result = runner.invoke(app, args)
    took = time.perf_counter() - started
    event(f"{args[0]} exit {result.exit_code}")  # pytest --hypothesis-show-statistics
    shown = f"latsim {' '.join(map(repr, args))}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        shown, repr(result.exception), result.stderr)
    assert result.exit_code in allowed, (shown, result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, shown
    if result.exit_code == 2:
        assert result.stderr.startswith("latsim: error: "), (shown, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), (
            shown, result.stderr)
    assert took < bound, (shown, took, bound)
    return result


def _tier(n: int):
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- parsers


def _check_model_numbers(model) -> None:
    for K in (1, 4, 21):
        try:
            mean, q = model.mean(K), model.quantile(K, 0.99)
        except LatsimError:
            continue  # a table without this K
        assert math.isfinite(mean) and math.isfinite(q) and mean >= 0 and q >= 0


@pytest.mark.parametrize("n", [pytest.param(FAST * 8, id="fast"),
                               pytest.param(SLOW * 10, id="slow", marks=pytest.mark.slow)])
def test_spec_parsers_return_a_model_or_one_latsim_error(n):
    @_tier(n)
    @given(cost=cost_specs, updates=update_specs, workload=workload_specs)
    def check(cost: str, updates: str, workload: str) -> None:
        with bounded(hang_bound()):
            for parse in (parse_arrivals, parse_duration, parse_activity):
                try:
                    parse(workload)
                except LatsimError as exc:
                    assert str(exc)
            try:
                _check_model_numbers(load_cost(cost))
            except LatsimError as exc:
                assert str(exc)
            try:
                source = parse_updates(updates)
            except LatsimError as exc:
                assert str(exc)
            else:
                assert source.replications(None) >= 1

    check()


def _check_trace_file(path: Path) -> None:
    problems = validate_trace(path)
    assert all(isinstance(p, str) and "\n" not in p and p.startswith(str(path))
               for p in problems), problems
    try:
        trace = load_trace(path)
    except LatsimError as exc:
        assert problems and str(exc).startswith(problems[0])
        return
    assert not problems
    times = list(trace.times)
    assert times == sorted(times) and all(math.isfinite(t) and t >= 0 for t in times)
    if trace.duration is not None:
        assert math.isfinite(trace.duration) and trace.duration > 0
        assert all(t < trace.duration for t in times)
    assert trace.duration is not None or times  # empty without a header is a problem


@pytest.mark.parametrize("n", [pytest.param(FAST * 8, id="fast"),
                               pytest.param(SLOW * 10, id="slow", marks=pytest.mark.slow)])
def test_trace_parser_on_random_text_and_bytes(n, tmp_path):
    path = tmp_path / "fuzz.jsonl"

    @_tier(n)
    @given(content=st.one_of(trace_texts, st.binary(max_size=120)))
    def check(content: str | bytes) -> None:
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        with bounded(hang_bound()):
            _check_trace_file(path)

    check()


# ---------------------------------------------------------------- command line

EXPERIMENT_OPTIONS = {
    "--K": numbers, "--r": numbers, "--fps": numbers, "--C": numbers, "--lead": numbers,
    "--q": numbers, "--duration": numbers, "--seeds": numbers, "--seed": numbers,
    "--commit-lead": numbers, "--jobs": numbers, "--cost": cost_specs,
    "--updates": update_specs,
    "--policy": st.one_of(st.sampled_from(["baseline", "speculative", "both"]), text),
    "--commit": st.one_of(st.sampled_from(["eager", "lazy"]), text),
}


@st.composite
def experiment_args(draw, command: str) -> list[str]:
    """``simulate``/``sweep`` with 1-3 fuzzed options over the small base, or only
    ``--max-events`` fuzzed (it is the work bound, so never with a larger run)."""
    options: dict[str, str | list[str]] = dict(BASE_SIMULATE)
    if draw(st.integers(0, 9)) == 0:
        options["--max-events"] = draw(numbers)
    else:
        names = draw(st.lists(st.sampled_from(sorted(EXPERIMENT_OPTIONS)), min_size=1,
                              max_size=3, unique=True))
        for name in names:
            if name == "--K" and command == "sweep":
                options[name] = draw(st.lists(numbers, min_size=1, max_size=3))
            else:
                options[name] = draw(EXPERIMENT_OPTIONS[name])
        if "--cost" in options:
            options.pop("--C")  # give one of them (both at once is its own error)
    args = [command, *_flatten(options)]
    return args + (["--json"] if draw(st.booleans()) else [])


@pytest.mark.parametrize("command", ["simulate", "sweep"])
@pytest.mark.parametrize("n", TIERS)
def test_cli_experiments_exit_0_or_one_error_line(command, n):
    @_tier(n)
    @given(args=experiment_args(command))
    def check(args: list[str]) -> None:
        result = invoke_checked(args)
        if result.exit_code == 0 and "--json" in args:
            envelope_of(result.stdout)

    check()


@pytest.mark.parametrize("n", TIERS)
def test_cli_theory(n):
    @_tier(n)
    @given(K=numbers, C=numbers, r=st.none() | numbers, fps=st.none() | numbers,
           rate=st.none() | numbers, as_json=st.booleans())
    def check(K, C, r, fps, rate, as_json) -> None:
        args = ["theory", "--K", K, "--C", C]
        for name, value in (("--r", r), ("--fps", fps), ("--rate", rate)):
            if value is not None:
                args += [name, value]
        result = invoke_checked(args + (["--json"] if as_json else []))
        if result.exit_code == 0 and as_json:
            out = row_of(result.stdout)
            assert all(math.isfinite(v) for v in out.values() if isinstance(v, float))

    check()


@pytest.mark.parametrize("n", TIERS)
def test_cli_traces_generate(n, tmp_path):
    @_tier(n)
    @given(kind=st.one_of(st.sampled_from(["low", "high", "continuous"]), text),
           count=st.none() | numbers, duration=st.none() | numbers, seed=st.none() | numbers,
           max_events=st.none() | numbers)
    def check(kind, count, duration, seed, max_events) -> None:
        args = ["traces", "generate", "--kind", kind, "--out", str(tmp_path / "set")]
        if max_events is not None and count is None and duration is None:
            args += ["--max-events", max_events]  # the work bound, fuzzed alone
        else:
            args += ["--max-events", "2000"]
        for name, value in (("--count", count), ("--duration", duration), ("--seed", seed)):
            if value is not None:
                args += [name, value]
        invoke_checked(args)

    check()


@pytest.mark.parametrize("n", TIERS)
@pytest.mark.parametrize("command", ["validate", "show"])
def test_cli_traces_validate_and_show(command, n, tmp_path):
    @_tier(n)
    @given(content=st.one_of(trace_texts, st.binary(max_size=120)),
           path_text=st.none() | text, max_events=st.none() | numbers)
    def check(content, path_text, max_events) -> None:
        path = tmp_path / "t.jsonl"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        target = str(path) if path_text is None else path_text
        args = ["traces", command, target]
        if max_events is not None:
            args += ["--max-events", max_events]
        # validate exits 1 when it found problems (it lists them on stdout)
        invoke_checked(args, allowed=(0, 1, 2) if command == "validate" else (0, 2))

    check()


@pytest.mark.parametrize("n", TIERS)
def test_cli_reproduce_jobs(n, tmp_path):
    """``--jobs`` fuzzed; a small work bound stops every valid combination at plan time."""

    @_tier(n)
    @given(jobs=numbers, traces=st.none() | text)
    def check(jobs, traces) -> None:
        args = ["reproduce", "--jobs", jobs, "--max-events", "1000", "--out",
                str(tmp_path / "paper")]
        if traces is not None:
            args += ["--traces", traces]
        result = invoke_checked(args, allowed=(2,))
        assert not (tmp_path / "paper").exists(), result.stderr

    check()


# ---------------------------------------------------------------- hostile files and values

#: 5,000 levels of nesting: past the parsers' recursion limit (about 170 KB of brackets)
DEEP = 5000


def _deep_inputs(folder: Path) -> dict[str, list[str]]:
    """A command line for each reader of a TOML or JSON(L) file, given a file nested
    :data:`DEEP` levels deep."""
    deep_toml = folder / "deep.toml"
    deep_toml.write_text("x = " + "[" * DEEP + "]" * DEEP + "\n")
    deep_json = folder / "deep.json"
    deep_json.write_text("[" * DEEP + "]" * DEEP + "\n")
    deep_line = folder / "deep.jsonl"
    deep_line.write_text('{"t": ' + "[" * DEEP + "]" * DEEP + "}\n")
    run = folder / "run"  # a run folder's config.json alone (``--records none``'s layout)
    run.mkdir()
    (run / "config.json").write_text('{"a": ' * DEEP + "1" + "}" * DEEP)
    fleet = folder / "fleet.toml"
    fleet.write_text(f'[workload]\nlog = "{deep_line}"\nupdates = "poisson:0.1"\n'
                     '[node]\nK = 8\ncost = "fixed:0.5"\npools = "dit=1"\n')
    return {
        "grid": ["grid", str(deep_toml), "--out", str(folder / "g")],
        "fleet": ["fleet", str(deep_toml)],
        "plan": ["plan", str(deep_toml)],
        "serving file": ["simulate", "--K", "8", "--C", "0.5", "--serving", str(deep_toml)],
        "trace": ["simulate", "--K", "8", "--C", "0.5", "--updates", f"trace:{deep_line}"],
        "session log": ["fleet", str(fleet)],
        "usp table": ["simulate", "--K", "8", "--cost", f"usp:{deep_json}"],
        "cost table": ["simulate", "--K", "8", "--cost", f"table:{deep_json}"],
        "run folder": ["compare", str(run)],
    }


@pytest.mark.parametrize("reader", ["grid", "fleet", "plan", "serving file", "trace",
                                    "session log", "usp table", "cost table",
                                    "run folder"])
def test_a_file_nested_too_deeply_is_one_error_line(reader, tmp_path):
    with bounded(hang_bound()):
        result = runner.invoke(app, _deep_inputs(tmp_path)[reader])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("latsim: error: "), result.stderr


@pytest.mark.parametrize("args", [
    ["simulate", "--K", "4", "--C", "1e-320", "--streams", "2", "--pools", "dit=1",
     "--duration", "5", "--seeds", "1"],
    pytest.param(["capacity", "--K", "8", "--C", "1e-320", "--pools", "dit=1", "--slo-l95",
                  "2", "--slo-stall", "0.1", "--duration", "5", "--min-seeds", "2",
                  "--max-seeds", "5"], marks=pytest.mark.slow),  # 9 s
], ids=["simulate", "capacity"])
def test_a_subnormal_cost_runs(args):
    """C = 1e-320 s overflowed T/C to inf and the nD/D/1 sums took a log of 0; and the
    capacity search's bootstrap over replications with no value printed scipy's warning
    that its interval cannot be calculated (only its standard error is read)."""
    with bounded(hang_bound()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert not [w for w in caught if "interval cannot be calculated" in str(w.message)]


@pytest.mark.parametrize("window", [["--t1", "inf"], ["--t0", "nan"], ["--t0", "-inf"]])
def test_a_timeline_window_must_be_finite(window, tmp_path):
    out = tmp_path / "run"
    made = runner.invoke(app, ["simulate", "--K", "4", "--C", "0.5", "--duration", "10",
                               "--seeds", "1", "--out", str(out)])
    assert made.exit_code == 0, made.stderr
    result = runner.invoke(app, ["plot", "timeline", str(out), *window])
    assert result.exit_code == 2
    assert result.stderr.startswith("latsim: error: the window needs finite times")
