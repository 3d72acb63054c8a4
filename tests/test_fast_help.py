"""``latsim --help`` drawn without typer (latsim.cli.fast_help) is typer's page, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from latsim.cli import app
from latsim.cli.fast_help import COMMANDS, OPTIONS, TYPER_SETTINGS

#: Either entry point, run as the program ``latsim`` (click names the program after argv[0]).
FAST = "import sys; sys.argv[0] = 'latsim'; from latsim.cli import main; main()"
TYPER = "import sys; sys.argv[0] = 'latsim'; from latsim.cli.root import main; main()"


def _env(columns: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TYPER_SETTINGS}
    env.update(COLUMNS=str(columns), NO_COLOR="", TERM="xterm-256color")
    env.pop("NO_COLOR")
    return env


def _run(code: str, args: list[str], columns: int) -> tuple[int, bytes, bytes]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          env=_env(columns), timeout=120)
    return done.returncode, done.stdout, done.stderr


def _run_on_a_terminal(code: str, args: list[str], columns: int) -> tuple[int, bytes]:
    """Run with stdout and stderr on a pseudo-terminal (rich colours only a terminal)."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=follower,
                               stderr=follower, stdin=subprocess.DEVNULL, env=_env(columns))
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=120), b"".join(chunks)


@pytest.mark.parametrize(("args", "columns"), [
    ([], 80), (["--help"], 80), (["-h"], 80), (["help"], 80), (["--help"], 40),
    (["--help"], 160)])
def test_the_page_is_typers_byte_for_byte(args, columns):
    fast = _run(FAST, args, columns)
    assert fast == _run(TYPER, args, columns)
    assert fast[0] == (2 if not args else 0) and b"Commands" in fast[1] and not fast[2]


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal is POSIX")
def test_the_page_is_coloured_as_typer_colours_it_on_a_terminal():
    fast = _run_on_a_terminal(FAST, ["--help"], 100)
    assert fast == _run_on_a_terminal(TYPER, ["--help"], 100)
    assert b"\x1b[1;36m" in fast[1]  # coloured: option and command names bold cyan


def test_the_page_imports_neither_typer_nor_click():
    code = ("import sys; sys.argv = ['latsim', '--help']\nfrom latsim.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'typer', 'click', 'numpy', 'markdown_it'}), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stderr.strip() == "[]"


def test_anything_else_goes_to_typer():
    # one command's help, and a setting that changes how typer draws
    code, out, _ = _run(FAST, ["sweep", "--help"], 80)
    assert code == 0 and b"--K" in out
    env = _env(80) | {"TERMINAL_WIDTH": "50"}
    done = subprocess.run([sys.executable, "-c", FAST, "--help"], capture_output=True,
                          env=env, timeout=120, check=True)
    assert max(len(line) for line in done.stdout.decode().splitlines()) == 50


def _context(command, path: str, **settings):  # typer's own click
    """A context for ``command`` of typer's click (typer 0.28 carries its own: the real
    ``click`` package, where one is installed, is another)."""
    return command.context_class(command, info_name=path, **settings)


def _is_group(command) -> bool:
    return callable(getattr(command, "list_commands", None))


def _groups() -> list:
    root = typer.main.get_command(app)
    found, todo = [], [("latsim", root)]
    while todo:
        path, group = todo.pop()
        found.append((path, group))
        ctx = _context(group, path)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if _is_group(command):
                todo.append((f"{path} {name}", command))
    return found


def test_the_root_lists_what_the_command_line_registers():
    root = typer.main.get_command(app)
    ctx = _context(root, "latsim", help_option_names=["-h", "--help"])
    listed = []
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        if not command.hidden:
            summary = (command.short_help or command.help or "").split("\n\n")[0]
            listed.append((name, summary.strip()))
    assert tuple(listed) == COMMANDS, "update latsim/cli/fast_help.py COMMANDS"
    options = [(",".join(o for o in p.opts if o.startswith("--")),
                ",".join(o for o in p.opts if not o.startswith("--")), p.help)
               for p in root.get_params(ctx) if not getattr(p, "hidden", False)]
    assert tuple(options) == OPTIONS, "update latsim/cli/fast_help.py OPTIONS"


def test_no_commands_summary_breaks_its_line():
    """typer's rich help keeps a single newline of a first paragraph in its command lists:
    a docstring's wrapped first line would print broken there."""
    broken = []
    for path, group in _groups():
        ctx = _context(group, path)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            summary = (command.short_help or command.help or "").split("\n\n")[0].strip()
            if "\n" in summary:
                broken.append(f"{path} {name}")
    assert not broken


def test_no_help_page_prints_a_docstrings_wrapped_lines():
    """typer's rich help keeps a paragraph's single newlines: each line of a paragraph but
    the first must start a list item or be indented (latsim.cli.root.unwrapped)."""
    ragged = []
    for path, group in _groups():
        ctx = _context(group, path)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            for paragraph in (command.help or "").split("\n\n"):
                for line in paragraph.split("\n")[1:]:
                    if not line.startswith(("- ", " ", "\b")):
                        ragged.append(f"{path} {name}: {line[:40]}")
    assert not ragged
