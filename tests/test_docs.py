"""The user-facing pages stay short and their links lead somewhere: the README within its size,
its first code block the two set-up commands, benchmarks/README.md within its size, and every
relative link of the README, benchmarks/README.md and each page under docs/ naming a file
(and, with a #fragment, a heading of that file) that exists. The benchmarks' records are the
ledger's: every file under benchmarks/results/ cited by benchmarks/README.md, every cited one
there, 1 MB in all, and every benchmark or record the source and the pages name there. The
source carries no history: no commit id, no issue number."""

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "benchmarks"
BENCHMARKS_README = BENCHMARKS / "README.md"
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


RECORD = re.compile(r"(?<![\w-])results/[\w.{},*/+-]*[\w}*/]")  # a record or folder cited in benchmarks/README.md


def expanded(citation: str) -> list[str]:
    """The paths a citation names, braces expanded: ``a_{x,y}.json`` names two files."""
    parts = re.split(r"\{([^}]*)\}", citation)
    choices = [part.split(",") if index % 2 else [part] for index, part in enumerate(parts)]
    return ["".join(choice) for choice in itertools.product(*choices)]


def cited_records(text: str) -> set[str]:
    """The paths under results/ the text names, relative to benchmarks/; a folder ends with ``/``."""
    return {path for citation in RECORD.findall(text) for path in expanded(citation)}


def ledger_errors(text: str, folder: Path) -> list[str]:
    """Cited records missing under ``folder`` (benchmarks/), files under its results/ no
    citation names (a cited folder names all it holds; ``*`` matches within a name)."""
    cited = cited_records(text)
    files = sorted(path.relative_to(folder).as_posix() for path in (folder / "results").rglob("*") if path.is_file())
    missing = [f"cited, absent: {path}" for path in sorted(cited) if not list(folder.glob(path.rstrip("/")))]
    named = [re.compile(re.escape(path).replace(r"\*", "[^/]*") + ("" if path.endswith("/") else "$")) for path in cited]
    uncited = [f"not cited: {path}" for path in files if not any(pattern.match(path) for pattern in named)]
    return missing + uncited


def test_every_record_is_cited_by_the_ledger_and_every_citation_exists():
    assert not ledger_errors(BENCHMARKS_README.read_text(), BENCHMARKS)


def test_the_records_fit_in_1_mb():
    assert sum(path.stat().st_size for path in (BENCHMARKS / "results").rglob("*") if path.is_file()) <= 1_000_000


def test_the_ledger_check_sees_a_missing_and_an_uncited_record(tmp_path):
    for name in ("results/engine/a.json", "results/engine/b_x.json", "results/engine/b_y.json",
                 "results/study/t.jsonl", "results/old.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    text = ("| x | `results/engine/a.json`, `results/engine/b_{x,y}.json` | `results/study/` |\n"
            "| y | `results/engine/gone.json` |")
    assert ledger_errors(text, tmp_path) == ["cited, absent: results/engine/gone.json", "not cited: results/old.json"]


BENCHMARK_PATH = re.compile(r"(?<![\w-])benchmarks/[\w.{},*/+-]*[\w}*/]")


def test_every_benchmark_path_the_source_and_the_pages_name_exists():
    """A docstring, comment, test or page naming ``benchmarks/...`` (a script, a record, a
    folder) names something there."""
    texts = [*sorted((ROOT / "src").rglob("*.py")), *sorted(BENCHMARKS.rglob("*.py")),
             *sorted((ROOT / "tests").rglob("*.py")), README, *sorted((ROOT / "docs").rglob("*.md"))]
    missing = [f"{path.relative_to(ROOT)}: {name}" for path in texts
               for citation in BENCHMARK_PATH.findall(path.read_text())
               for name in expanded(citation) if not list(ROOT.glob(name.rstrip("/")))]
    assert not missing


COMMIT_ID = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w.])")
ISSUE = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)", re.IGNORECASE)  # ours; "vLLM #54282" cites another project


def history_in(text: str) -> list[str]:
    return COMMIT_ID.findall(text) + ISSUE.findall(text)


def test_the_source_names_no_commit_and_no_issue():
    """History belongs in benchmarks/README.md and the commit messages: a docstring or comment
    cites a benchmark instead."""
    found = [f"{path.relative_to(ROOT)}: {hit}" for path in sorted((ROOT / "src").rglob("*.py"))
             for hit in history_in(path.read_text())]
    assert not found


def test_the_history_check_sees_commits_and_issues():
    assert history_in("fixed in commit 36a5dd3 (issue 10 part 4), see (#13); issues #7") == \
        ["36a5dd3", "issue 10", "(#13)", "issues #7"]
    assert history_in("float32 bf16 0x7fffffff deadbeef SGLang #31214 transformers#47932 color:#444") == []
