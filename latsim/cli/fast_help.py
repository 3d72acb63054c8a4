"""``latsim --help`` without typer: the top-level help page, drawn by rich as typer draws it.

Importing typer, click and typer's help renderer (which loads ``rich.markdown`` and
``markdown_it`` whether or not the help uses them) costs about three times what the page
needs. :func:`latsim.cli.main` asks :func:`top_level_help` first and imports the
command line only when the page was not asked for. The page is built from the same rich
renderables, styles and theme as ``typer.rich_utils.rich_format_help``, so it is the same
text at every width, coloured the same in a terminal; ``tests/test_fast_help.py`` compares
the two byte for byte (widths 40 to 160, with and without colour) and fails when a command
is added, renamed or re-described without :data:`COMMANDS` following. Anything else (one
command's help, an environment variable that changes how typer draws, a program name other
than ``latsim``) goes to typer.
"""

from __future__ import annotations

import os
import sys

#: The root command's help (its callback's docstring in :mod:`latsim.cli.root`).
APP_HELP = """Response-latency simulator for interactive video generation (theory, SimPy
simulation, live measurement).

One command's help: latsim help COMMAND, or latsim COMMAND -h.

What can be plugged in (cost models, schedules, generators): latsim plugins."""

#: The root's options as typer lists them: (long names, short names, help).
OPTIONS = (
    ("--version", "", "print latsim's version and exit"),
    ("--quiet", "-q", "no progress bars or status lines (results still print)"),
    ("--install-completion", "", "Install completion for the current shell."),
    ("--show-completion", "",
     "Show completion for the current shell, to copy it or customize the installation."),
    ("--help", "-h", "Show this message and exit."),
)

#: Every command in registration order, with the first paragraph of its help.
COMMANDS = (
    ("simulate", "Simulate one K under one or both policies; records per condition, job, "
                 "slot, stall."),
    ("sweep", "One row per (K, policy). Defaults: Wan1.3B at 16 fps, r=4 (see README)."),
    ("theory", "Every closed form of the timing model for one setting."),
    ("plugins", "List the cost models, schedules, live generators and placements, and who "
                "provides each."),
    ("controller", "Print the controller's transition table (or its Mermaid state diagram)."),
    ("help", "Show the help of latsim or of one command (the same as COMMAND --help)."),
    ("compare", "Measured vs predicted: re-simulate each run with its own measured C "
                "samples."),
    ("capacity", "Largest number of streams meeting an SLO."),
    ("grid", "Run a design-space grid from a TOML file; resumable."),
    ("plan", "Which K, policy, USP degree, node shape and fleet size meet an SLO most "
             "cheaply."),
    ("traces", "Condition traces: generate the paper's workload, validate and summarise "
               "sets."),
    ("reproduce", "Reproduce the paper's latency results: theory, simulation and the paper "
                  "side by side (latsim reproduce -> results/paper/); 'latsim reproduce "
                  "serving': the serving model on the paper's settings (-> "
                  "results/serving/); 'latsim reproduce systems': the seed systems (-> "
                  "results/systems/); 'latsim reproduce fleet': fleets (-> "
                  "results/fleet/); 'latsim reproduce replan-rule': the replan rule's two "
                  "readings (-> results/replan_rule/)."),
    ("plot", "Figures drawn from a run folder's CSV records."),
    ("export", "Run folders in other tools' formats."),
    ("fleet", "Sessions across nodes: latsim fleet FILE (the same as latsim fleet run "
              "FILE) simulates a fleet; latsim fleet plan FILE sizes one."),
    ("client", "Viewer client: measures L from send to display against latsim serve."),
    ("measure", "Live run: a real generator (wan, ltx, sleep, ...) under latsim's "
                "controller."),
    ("profile", "Measure C per K and job kind (refill, replan); write a --cost table:PATH "
                "file."),
    ("serve", "Live server: a generator and the controller behind a WebSocket endpoint."),
)

PROGRAM = "latsim"
#: Environment variables that change how typer or rich draw help; with any of them set,
#: typer draws it.
TYPER_SETTINGS = ("TERMINAL_WIDTH", "_TYPER_FORCE_DISABLE_TERMINAL", "GITHUB_ACTIONS",
                  "FORCE_COLOR", "PY_COLORS", "_LATSIM_COMPLETE", "TYPER_USE_RICH")


def top_level_help(argv: list[str]) -> int | None:
    """Print the top-level help page if ``argv`` asks for it (``latsim``, ``latsim -h``,
    ``latsim --help``, ``latsim help``) and return the exit status typer would give (2
    for no arguments, as click's ``no_args_is_help``; else 0). None: not asked, or
    typer must draw it."""
    if os.path.basename(argv[0]) != PROGRAM or any(os.environ.get(name) for name in
                                                   TYPER_SETTINGS):
        return None
    args = argv[1:]
    if args not in ([], ["-h"], ["--help"], ["help"]):
        return None
    print_help()
    if not args:
        return 2
    sys.stdout.write("\n")  # typer echoes click's (empty) help text after drawing it
    return 0


def print_help() -> None:
    """Draw the page as ``typer.rich_utils.rich_format_help`` draws the root's."""
    from rich.align import Align
    from rich.columns import Columns
    from rich.console import Console, Group
    from rich.highlighter import RegexHighlighter
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from rich.theme import Theme

    from latsim.cli.help_layout import HelpTable

    class OptionHighlighter(RegexHighlighter):  # typer.rich_utils' own
        highlights = [r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
                      r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
                      r"(?P<types>\<[^\>]+\>)",
                      r"(?P<usage>Usage: )"]

    highlight = OptionHighlighter()
    console = Console(theme=Theme({
        "option": "bold cyan", "switch": "bold green", "negative_option": "bold magenta",
        "negative_switch": "bold red", "types": "bold yellow", "types_sep": "dim",
        "usage": "yellow"}), highlighter=highlight, color_system="auto")

    def text(markup: str, style: str = "") -> Text:
        return highlight(Text.from_markup(markup.strip(), style=style))

    def panel(table: Table, title: str) -> Panel:
        return Panel(table, border_style="dim", title=title, title_align="left")

    def table(highlighted: bool) -> Table:
        return HelpTable(highlight=highlighted, show_header=False, expand=True, box=None,
                         show_lines=False, leading=0, border_style=None, row_styles=None,
                         pad_edge=False, padding=(0, 1))

    console.print(Padding(highlight(f"Usage: {PROGRAM} [OPTIONS] COMMAND [ARGS]..."), 1),
                  style="bold")
    first, *rest = APP_HELP.split("\n\n")
    console.print(Padding(Align(Group(text(first.replace("\n", " ")), Text(""),
                                      text("\n\n".join(rest), "dim")), pad=False),
                          (0, 1, 1, 1)))
    options = table(highlighted=True)
    for long_names, short_names, help_text in OPTIONS:
        options.add_row(highlight(long_names), highlight(short_names), highlight(""),
                        highlight(""), Text(style="bold yellow", overflow="fold"),
                        Columns([text(help_text)]))
    console.print(panel(options, "Options"))
    commands = table(highlighted=False)
    commands.add_column(style="bold cyan", no_wrap=True,
                        width=max(len(name) for name, _ in COMMANDS))
    commands.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for name, summary in COMMANDS:
        commands.add_row(Text(name), text(summary))
    console.print(panel(commands, "Commands"))

