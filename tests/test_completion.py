"""Shell completion completes option values: plug-in names from the registries, spec
prefixes, fixed choices (bash, as ``latsim --install-completion`` sets it up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LATSIM = str(Path(sys.executable).parent / "latsim")


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_LATSIM_COMPLETE": "complete_bash", "_TYPER_COMPLETE_ARGS": words,
           "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (words[-1] != " "))}
    result = subprocess.run([LATSIM], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("words, expected", [
    ("latsim simulate --schedule ", ["fifo", "least-slack", "replan-first"]),
    ("latsim simulate --schedule l", ["least-slack"]),
    ("latsim capacity --cost fi", ["fixed:"]),
    ("latsim simulate --updates tr", ["trace:", "traces:"]),
    ("latsim simulate --policy s", ["speculative"]),
    ("latsim simulate --format ", ["table", "csv", "json"]),
    ("latsim fleet run x.toml --placement min", ["min-max"]),
])
def test_option_values_complete(words, expected):
    assert _complete(words) == expected


def test_live_generators_complete_from_the_registry():
    pytest.importorskip("harness.cli", reason="the live extra adds latsim measure")
    assert {"wan", "ltx", "sleep"} <= set(_complete("latsim measure --generator "))
