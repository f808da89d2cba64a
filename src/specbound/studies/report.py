"""``specbound report``: one Markdown file and its HTML twin from a results directory.

The report gathers every study found below the directory (each study's results are a
folder with a ``settings.json``, see ``records``), and writes ``report.md``,
``report.html`` and the PNG figures into ``<results>/report/``: the models and settings
used, the run time, then each registered study's own sections (``Study.report_blocks``:
its tables, figures and the papers' findings checked on our numbers).
"""

from __future__ import annotations

import datetime
from pathlib import Path

from specbound.studies import STUDIES  # every study registered
from specbound.studies.document import Heading, Paragraph, Table, to_html, to_markdown
from specbound.studies.records import REPORT_FOLDER, SETTINGS_FILE, StudyResults, find_results

def _fitting(studies: list[StudyResults], what: str, build):
    """``build()``, with a record or setting the report needs and does not find turned into
    a ValueError naming the folders: results of another study type or version."""
    try:
        return build()
    except (KeyError, TypeError, IndexError) as error:
        folders = ", ".join(str(results.directory) for results in studies)
        raise ValueError(f"results: {folders}: the {what} lack what the report reads ({type(error).__name__}: "
                         f"{error}); written by another study type or version of specbound?") from None


def weights_description(models: dict, files: bool = True) -> str:
    """How the pair ran: the torch dtype, or as its backend describes its settings
    (``Backend.weights_description``: llama.cpp's have no dtype, the GGUF files run as they
    are), with its files where ``files``."""
    from specbound.engine.backends import BACKENDS, get_backend

    if models.get("dtype") is not None:
        return str(models["dtype"])
    if models.get("backend") in BACKENDS:
        return get_backend(models["backend"]).weights_description(models, files)
    return "dtype not recorded"


def _settings_blocks(studies: list[StudyResults], root: Path) -> list:
    overview = []
    blocks = []
    for results in studies:
        settings = results.settings
        models = settings["models"]
        folder = str(results.directory.relative_to(root)) or "."
        overview.append([
            settings["study"], settings["dataset"], folder,
            f"{models.get('target')} / {models.get('draft')} ({weights_description(models, files=False)})",
            str(len(results.runs)), f"{results.total_seconds / 60:.1f} min",
        ])
        shown = [[key, _setting(value)] for key, value in settings.items()
                 if key not in ("study", "dataset", "models")]
        blocks += [Heading(3, f"{settings['study']} / {settings['dataset']} settings"), Table(["setting", "value"], shown)]
    first = studies[0].settings["models"]
    if first.get("draft") is None:  # suffix drafts: no draft model
        models = (f"Target `{first.get('target')}` and no draft model (drafts from the texts), "
                  f"{weights_description(first)}; vocabulary of {first.get('vocab_size')} tokens; prompts formatted "
                  f"as {first.get('prompt_format')}. The target's logits go through the run's processing "
                  "(temperature, top-k, top-p).")
    else:
        models = (f"Target `{first.get('target')}`, draft `{first.get('draft')}`, {weights_description(first)}; "
                  f"vocabulary of {first.get('vocab_size')} tokens shared by both; prompts formatted as "
                  f"{first.get('prompt_format')}. Target and draft logits go through the same processing "
                  "(temperature, top-k, top-p).")
    return [
        Heading(2, "Models, settings and run time"),
        Paragraph(models + " Run time is the wall-clock of the finished runs (generation, scoring and exact "
                  "computations), on this machine."),
        Table(["study", "dataset", "folder", "target / draft", "runs", "run time"], overview),
        Paragraph("Where the time went (wall-clock; generate = the engine's generation, score = the two "
                  "scoring forwards, the rest = exact computations from the rows):"),
        Table(*phase_table(studies)),
        *blocks,
    ]


def _setting(value) -> str:
    if isinstance(value, list):
        return ", ".join(_setting(item) for item in value)
    if value is None:
        return "—"
    return f"{value:g}" if isinstance(value, float) else str(value)


def phase_table(studies: list[StudyResults]) -> tuple[list[str], list[list]]:
    """Wall-clock minutes per phase of each study's finished runs (generation by the engine,
    scoring forwards, exact computations), and the share of each."""
    phases = sorted({phase for results in studies for seconds in results.timings.values() for phase in seconds}
                    - {"total"})
    headers = ["study", "dataset", "runs", *phases, "total", "per run"]
    rows = []
    for results in studies:
        totals = {phase: sum(seconds.get(phase, 0.0) for seconds in results.timings.values()) for phase in phases}
        total = results.total_seconds
        cells = [f"{totals[phase] / 60:.1f} min ({100 * totals[phase] / total:.0f}%)" if total else "—" for phase in phases]
        per_run = f"{total / len(results.timings):.0f} s" if results.timings else "—"
        rows.append([results.settings["study"], results.settings["dataset"], str(len(results.timings)), *cells,
                     f"{total / 60:.1f} min", per_run])
    return headers, rows


def write_report(directory, studies: list[StudyResults] | None = None) -> Path:
    """Write ``report.md``, ``report.html`` and the figures into ``<directory>/report/``;
    return the Markdown file's path. ``studies``: what ``records.find_results`` found below
    ``directory`` already (None: found here)."""
    root = Path(directory)
    output = root / REPORT_FOLDER
    figure_dir = output / "figures"
    markdown_path = output / "report.md"
    for path, wanted in ((output, "folder"), (figure_dir, "folder"), (markdown_path, "file"),
                         (output / "report.html", "file")):
        if path.exists() and path.is_dir() != (wanted == "folder"):
            raise ValueError(f"results: {path} is a {'file' if wanted == 'folder' else 'folder'} where the report "
                             f"writes its {wanted}; move it away")
    studies = find_results(root) if studies is None else studies
    figure_dir.mkdir(parents=True, exist_ok=True)
    title = "specbound study report"
    blocks = [
        Heading(1, title),
        Paragraph(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} from `{root}`. "
                  f"Total run time of the studies: {sum(r.total_seconds for r in studies) / 60:.1f} min."),
    ]
    blocks += _fitting(studies, f"{SETTINGS_FILE} files", lambda: _settings_blocks(studies, root))
    for name, study in sorted(STUDIES.items(), key=lambda item: item[1].order):
        found = [results for results in studies if results.settings["study"] == name]
        if found:
            blocks += _fitting(found, f"records of the {name} study", lambda: study.report_blocks(found, figure_dir))
    markdown_path.write_text(to_markdown(blocks), encoding="utf-8")
    (output / "report.html").write_text(to_html(blocks, title), encoding="utf-8")
    return markdown_path
