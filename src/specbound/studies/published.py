"""Hu et al. (ICLR 2025) [HU]'s published acceptance figures, set beside ours in the
acceptance study's report (``acceptance_report.published_blocks``).

Only the figures this project holds with their source are here, as docs/SPEC.md quotes them:
per-token one-step acceptance, draft OPT-125M, target OPT-6.7B. SPEC.md quotes them without
their setting and without standard errors; the paper's defaults are 1024 prompts per task,
128 new tokens, temperature 0.7 and n = 3 (SPEC.md §5). Their model pair is not ours, so the
report compares the orderings of the methods and their gaps to α*, not the values.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_PAIR = "OPT-125M → OPT-6.7B"


@dataclass(frozen=True)
class PublishedTable:
    """One of [HU]'s tasks: method (a key of ``acceptance_methods``) -> published per-token
    acceptance, as a fraction; ``source`` says where each figure is quoted."""

    task: str
    acceptance: dict[str, float]
    source: str


# our dataset (its stand-in for the task, ``datasets.DATASETS``) -> [HU]'s figures for the task
PUBLISHED = {
    "instructions": PublishedTable(
        "Alpaca",
        {"optimal_with_replacement": 0.869, "kseq": 0.858, "rrs": 0.854, "optimal_without_replacement": 0.899,
         "rrs_without_replacement": 0.889, "greedy": 0.907},
        "SPEC.md §4.2 (optima, K-SEQ, RRS, greedy) and §5 (RRS without replacement, greedy)",
    ),
    "summarize": PublishedTable("CNN/DailyMail", {"rrs_without_replacement": 0.815, "greedy": 0.842}, "SPEC.md §5"),
    "translate_de_en": PublishedTable("WMT'14 De-En", {"rrs_without_replacement": 0.751, "greedy": 0.770},
                                      "SPEC.md §5"),
}

# our dataset -> why [HU]'s figures for its task are not set beside the one-step table
NOT_COMPARABLE = {
    "mt_bench": "Hu et al.'s MT-Bench figures (88.8% vs 80.4% at T = 0.1 with 4 drafts, 1.17× speed; SPEC.md §5) "
    "come from multi-step draft trees, and SPEC.md does not say which method each belongs to: they are not "
    "the one-step acceptance measured here, so no published column is shown.",
}
