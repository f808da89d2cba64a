"""Inputs shared by several commands: a (target, draft) pair from the command line or a
JSON file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FIXTURE_A = ("0.4,0.3,0.2,0.1", "0.1,0.2,0.3,0.4")  # SPEC.md §4.4


def parse_distribution(text: str, name: str) -> np.ndarray:
    """Comma-separated probabilities, or a path to a JSON list / {"target", "draft"} object."""
    path = Path(text)
    if path.suffix == ".json" or path.is_file():
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{name}: cannot read JSON file {text!r}: {error}") from None
        if isinstance(payload, dict):
            key = "target" if name == "target_probs" else "draft"
            if key not in payload:
                raise ValueError(f"{name}: JSON object in {text!r} has no {key!r} list")
            payload = payload[key]
        return np.asarray(payload, dtype=np.float64)
    try:
        return np.array([float(value) for value in text.split(",")])
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated numbers or a JSON file, got {text!r}") from None


def distribution_pair(target: str | None, draft: str | None, default=None) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) from --target/--draft: a JSON file given as --target alone supplies
    both; with neither given, ``default`` (a pair of texts) when there is one."""
    if target is None and draft is None and default is not None:
        target, draft = default
    if target is None:
        raise ValueError("target_probs: --draft given without --target" if draft else "target_probs: --target is required")
    return parse_distribution(target, "target_probs"), parse_distribution(draft if draft is not None else target,
                                                                          "draft_probs")


def add_pair_arguments(parser, default_help: str = "") -> None:
    parser.add_argument("--target", help="target probabilities p: '0.4,0.3,0.2,0.1' or a JSON file "
                        f'(a list, or {{"target": [...], "draft": [...]}}){default_help}')
    parser.add_argument("--draft", help="draft probabilities q (same forms); defaults to the JSON file of --target")
