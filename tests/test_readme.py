"""The README's own examples run and print what it says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_python_api_example_prints_what_the_readme_shows():
    (block,) = re.findall(r"```python\n(.*?)```", _section("Python API"), re.S)
    expected = [line[2:] for line in block.splitlines() if line.startswith("# ")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})  # the README's own code
    assert out.getvalue().splitlines() == expected


def test_the_glossary_names_every_summary_column_the_main_table_leads_with():
    glossary = _section("Glossary")
    for term in ("K", "T", "C", "lead", "R, Q", "L", "w", "A", "stall %"):
        assert f"| {term} |" in glossary, term


def test_every_relative_link_of_the_readme_and_docs_resolves():
    root = README.parent
    broken = []
    for page in [README, root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"(https?:|#|mailto:)", target):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
