"""``specbound report RESULTS_DIR``: one Markdown report and its HTML version, with tables
and PNG figures, from every study found below RESULTS_DIR (see ``specbound.studies.report``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbound.cli.inputs import check_study_settings
from specbound.studies.records import find_results


def run(args: argparse.Namespace) -> int:
    check_results_folder(args.results_dir)
    check_study_settings(args.results_dir, "results")
    check_holds_results(args.results_dir)
    studies = find_results(args.results_dir)  # every record read and checked, without the studies

    from specbound.studies.report import write_report  # after the checks: it imports the studies (torch)

    markdown = write_report(args.results_dir, studies)
    print(f"wrote {markdown}")
    print(f"wrote {markdown.with_suffix('.html')}")
    return 0


def check_results_folder(text: str) -> None:
    """An existing folder, named: an empty value is no folder (never the current one)."""
    if not text.strip():
        raise ValueError("results: expected a folder, got ''")
    if not Path(text).is_dir():
        raise ValueError(f"results: {text!r} " + ("is a file, not a folder" if Path(text).exists() else "does not exist"))


def check_holds_results(text: str) -> None:
    """Refuse a folder with no study's settings file below it, before its records are read
    (``studies.records.find_results`` says the rest)."""
    from specbound.studies.records import SETTINGS_FILE

    if next(Path(text).rglob(SETTINGS_FILE), None) is None:
        raise ValueError(f"results: no study results (a folder with {SETTINGS_FILE} and finished runs) below {text}")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="Markdown + HTML report of study results",
        description="Render every study's results below RESULTS_DIR (written by `specbound study`) as "
        "RESULTS_DIR/report/report.md and report.html, with tables and PNG figures.",
    )
    parser.add_argument("results_dir", metavar="RESULTS_DIR", help="folder the studies wrote (their --out)")
    parser.set_defaults(handler=run)
