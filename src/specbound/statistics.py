"""Means and their standard errors: of independent values (Monte Carlo runs, one value per
prompt) and per-token means with standard errors over prompts (the studies' averages).

A per-token average pools every generated position of every prompt: with S_i the sum of a
per-position quantity over prompt i's T_i positions, m = Σ S_i / Σ T_i. Positions of one
prompt are not independent (they share the prompt and the text so far), prompts are, so
the standard error treats each prompt as one cluster (the ratio-estimator, or delta-method,
standard error): se² = n/(n − 1) · Σ_i (S_i − m T_i)² / (Σ_i T_i)², n = number of prompts.
With one prompt there is no error estimate (NaN).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np


def per_token_mean(sums, counts) -> tuple[float, float]:
    """(m, se) from per-prompt sums S_i and position counts T_i.  # [n], [n] -> float, float"""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if sums.shape != counts.shape or sums.ndim != 1 or sums.size == 0:
        raise ValueError(f"sums, counts: expected two non-empty vectors of one length, got {sums.shape}, {counts.shape}")
    if np.any(counts <= 0):
        raise ValueError("counts: every prompt needs at least one position")
    mean = sums.sum() / counts.sum()
    if sums.size < 2:
        return float(mean), math.nan
    spread = np.sum((sums - mean * counts) ** 2) * sums.size / (sums.size - 1)
    return float(mean), float(math.sqrt(spread) / counts.sum())


def mean_and_standard_error(values) -> tuple[float, float]:
    """Mean of independent values and its standard error s/√n, s with Bessel's correction
    (NaN for a single value: no error estimate)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values: expected a non-empty vector, got shape {values.shape}")
    if values.size < 2:
        return float(values.mean()), math.nan
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def running_mean_and_standard_error(values) -> tuple[np.ndarray, np.ndarray]:
    """``mean_and_standard_error`` of the first n values, for n = 1..N (error NaN at n = 1).
    # [N] -> [N], [N]"""
    values = np.asarray(values, dtype=np.float64)
    counts = np.arange(1, values.size + 1)
    means = np.cumsum(values) / counts
    squares = np.cumsum(values**2) / counts
    with np.errstate(invalid="ignore", divide="ignore"):
        variances = np.maximum(squares - means**2, 0.0) * counts / (counts - 1)
        errors = np.sqrt(variances / counts)
    errors[0] = np.nan
    return means, errors


def grouped_per_token_means(
    records: Iterable[dict], group: Callable[[dict], tuple], value: Callable[[dict], float]
) -> dict[tuple, tuple[float, float, int]]:
    """Per-token mean, its standard error and the number of positions, for each group of
    position records; prompts are told apart by the record's ``prompt_id``."""
    sums: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in records:
        key = group(record)
        sums[key][record["prompt_id"]] += value(record)
        counts[key][record["prompt_id"]] += 1
    summary = {}
    for key in sums:
        prompts = list(sums[key])
        mean, error = per_token_mean([sums[key][p] for p in prompts], [counts[key][p] for p in prompts])
        summary[key] = (mean, error, sum(counts[key].values()))
    return summary
