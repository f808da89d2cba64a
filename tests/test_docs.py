"""The user-facing pages stay short and their links lead somewhere: the README within its size,
its first code block the two set-up commands, benchmarks/README.md within its size, and every
relative link of the README, benchmarks/README.md and each page under docs/ naming a file
(and, with a #fragment, a heading of that file) that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS_README = ROOT / "benchmarks" / "README.md"
PAGES = [README, BENCHMARKS_README, *sorted((ROOT / "docs").rglob("*.md"))]
SET_UP_COMMANDS = ['pip install -e ".[models]" && specbound run',
                   'pip install -e ".[test]" && python -m pytest -q']
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), images left out
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links outside code blocks and inline code."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", FENCE.sub("", page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_readme_fits_in_12000_bytes():
    assert len(README.read_bytes()) <= 12_000


def test_benchmarks_readme_is_under_15000_bytes():
    assert len(BENCHMARKS_README.read_bytes()) < 15_000


def test_readme_starts_with_the_two_set_up_commands():
    first_block = re.search(r"^```[^\n]*\n(.*?)^```", README.read_text(), re.DOTALL | re.MULTILINE)
    assert first_block.group(1).splitlines() == SET_UP_COMMANDS


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file_and_heading(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in heading_anchors(linked):
            broken.append(target)
    assert not broken


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [gone](missing.md) [no heading](page.md#nowhere)\n"
                    "```\n[in code](ignored.md)\n```\n")
    assert links(page) == ["page.md#title", "missing.md", "page.md#nowhere"]
    assert heading_anchors(page) == {"title"}
