"""Inputs shared by several commands: a (target, draft) pair from the command line or a
JSON file; text from standard input; prompt sets; model sources; the settings of a study's
results folder."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np

from specbound.datasets import Prompt, load_prompts
from specbound.models.gguf import EMBEDDED_GGUFS


FIXTURE_A = ("0.4,0.3,0.2,0.1", "0.1,0.2,0.3,0.4")  # SPEC.md §4.4


def parse_distribution(text: str, name: str) -> np.ndarray:
    """Comma-separated probabilities (one row), or a path to a JSON file holding a list of
    probabilities, a list of such rows (a batch), or a {"target", "draft"} object of them.
    # -> [vocab] or [batch, vocab]"""
    path = Path(text)
    if path.suffix == ".json" or _is_file(path):
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"{name}: cannot read JSON file {text!r}: {error}") from None
        source = f"JSON file {text!r}"
        if isinstance(payload, dict):
            key = "target" if name == "target_probs" else "draft"
            if key not in payload:
                raise ValueError(f"{name}: JSON object in {text!r} has no {key!r} list")
            payload, source = payload[key], f"{source}, key {key!r},"
        return _probability_rows(payload, name, source)
    try:
        return np.array([float(value) for value in text.split(",")])
    except ValueError:
        shown = text if len(text) <= 40 else f"{text[:40]}… ({len(text)} characters)"
        raise ValueError(f"{name}: expected comma-separated numbers or a JSON file, got {shown!r}") from None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for a path (a long list of numbers), a NUL byte
        return False


def _probability_rows(payload, name: str, source: str) -> np.ndarray:
    """A JSON list of numbers, or a non-empty list of equally long lists of numbers, as
    float64; anything else is refused naming ``source``."""
    def numbers(values) -> bool:
        return isinstance(values, list) and bool(values) and all(
            isinstance(value, (int, float)) and not isinstance(value, bool) for value in values)

    if not (numbers(payload) or (isinstance(payload, list) and payload and all(numbers(row) for row in payload))):
        raise ValueError(f"{name}: {source} must hold a list of probabilities or a list of such rows, "
                         f"got {type(payload).__name__} {json.dumps(payload)[:40]}")
    if isinstance(payload[0], list) and len({len(row) for row in payload}) > 1:
        raise ValueError(f"{name}: the rows in {source} differ in length "
                         f"({', '.join(map(str, sorted({len(row) for row in payload})))})")
    try:
        return np.array(payload, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{name}: {source} holds a number too large for a float") from None


def distribution_pair(target: str | None, draft: str | None, default=None) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) from --target/--draft: a JSON file of a {"target", "draft"} object
    given as --target alone supplies both; with neither given, ``default`` (a pair of
    texts) when there is one."""
    if target is None and draft is None and default is not None:
        target, draft = default
    if target is None:
        raise ValueError("target_probs: --draft given without --target" if draft else "target_probs: --target is required")
    target_probs = parse_distribution(target, "target_probs")
    if draft is None and not _holds_an_object(Path(target)):
        raise ValueError("draft_probs: --draft is required (only a JSON file of a {\"target\", \"draft\"} object as "
                         "--target supplies both)")
    return target_probs, parse_distribution(draft if draft is not None else target, "draft_probs")


def _holds_an_object(path: Path) -> bool:
    """Whether ``path`` is a readable JSON file of an object."""
    if not _is_file(path):
        return False
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def add_pair_arguments(parser, default_help: str = "") -> None:
    parser.add_argument("--target", help="target probabilities p: '0.4,0.3,0.2,0.1' or a JSON file "
                        f'(a list, or {{"target": [...], "draft": [...]}}){default_help}')
    parser.add_argument("--draft", help="draft probabilities q (same forms); required unless --target is a JSON file "
                        'of a {"target": [...], "draft": [...]} object')


def standard_input_text(name: str) -> str:
    """All of standard input as UTF-8 text; ValueError naming ``name`` (and the first bad
    byte) when it is not UTF-8."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name}: standard input is not UTF-8 text (byte {error.start:,} of {len(data):,} is "
                         f"0x{data[error.start]:02x})") from None


def prompt_set(name: str, limit: int | None, option: str) -> list[Prompt]:
    """``datasets.load_prompts(name, limit)``, with a file that cannot be read (not UTF-8,
    not gzip behind a .gz name, cut short) or a missing package refused naming ``option``."""
    try:
        prompts = load_prompts(name, limit=limit)
    except (ValueError, OSError, EOFError, zlib.error, ImportError) as error:
        raise ValueError(f"{option.lstrip('-')}: cannot read {name!r}: {error}") from None
    if not prompts:
        raise ValueError(f"{option.lstrip('-')}: {name!r} holds no prompt")
    return prompts


def check_model_sources(sources: dict[str, str | None], gguf_only: bool = False) -> None:
    """Refuse, before anything loads, a model of ``sources`` (option name -> source; None:
    a model not loaded) that is no embedded model's name, existing .gguf file or (but with
    ``gguf_only``) Hugging Face folder with a config.json; ValueError naming the option."""
    for option, source in sources.items():
        if source is None or _names_a_model(source, gguf_only):
            continue
        forms = (f"an embedded model ({', '.join(EMBEDDED_GGUFS)}) or an existing .gguf file" if gguf_only else
                 f"an embedded model ({', '.join(EMBEDDED_GGUFS)}), an existing .gguf file or a Hugging Face "
                 "folder with a config.json")
        shown = repr(source) if len(source) <= 80 else f"{source[:80]!r}… ({len(source):,} characters)"
        raise ValueError(f"{option}: expected {forms} for --{option}, got {shown}")


def _names_a_model(source: str, gguf_only: bool) -> bool:
    path = Path(source)
    return source in EMBEDDED_GGUFS or (bool(source.strip()) and (
        (path.suffix == ".gguf" and _is_file(path)) or (not gguf_only and _is_file(path / "config.json"))))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for a path
        return False


def check_study_settings(directory: Path, field: str) -> None:
    """Refuse, before any model loads, a results folder below ``directory`` (itself
    included) whose settings file is no study's (``records.read_settings``: not a JSON
    object); the message starts with ``field``."""
    from specbound.studies.records import SETTINGS_FILE, read_settings

    for path in sorted(Path(directory).rglob(SETTINGS_FILE)) if Path(directory).is_dir() else []:
        read_settings(path, field)
