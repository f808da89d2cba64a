"""What a study is, and the one registry of studies.

A study reruns one of the papers' experiments on a real (target, draft) pair (SPEC.md §5).
It is one class, registered with ``@register_study``, that owns everything about it:
- its command-line options (``add_arguments``, with its ``help``, ``presets``, report
  ``order`` and ``record_fields``: declared in ``options.STUDY_OPTIONS``, which imports no
  torch, and given to the class as it registers) and how they build it (``from_arguments``);
- its **units** — one engine generation for one prompt at one setting (a temperature, a
  decoding configuration) — and how one unit becomes records (``run_unit``);
- its tables (``summary_tables``, printed by ``specbound study``) and its report sections
  (``report_blocks``, rendered by ``specbound report``).
``specbound study`` and ``specbound report`` iterate ``STUDIES``: adding a study is adding
its module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from specbound.datasets import Prompt
from specbound.models.pair import ModelPair
from specbound.studies.fields import RecordFields
from specbound.studies.options import STUDY_OPTIONS


@dataclass(frozen=True)
class Unit:
    key: str  # unique within the study, e.g. "HumanEval/0|T=0.7"
    prompt: Prompt
    config: dict  # the unit's setting (temperature, decoding configuration, ...)


@dataclass
class UnitOutput:
    positions: list[dict]  # one record per (position, ...) of the generation
    run: dict  # the generation's summary: tokens, engine counts, per-sequence totals
    seconds: dict = field(default_factory=dict)  # wall-clock by phase


def setting_units(prompts: list[Prompt], temperatures, configs=None) -> list[Unit]:
    """One unit per (temperature, configuration, prompt), keyed "prompt|T=t" or
    "prompt|T=t|label" (each configuration has a ``label``); the unit's config holds the
    temperature and the configuration."""
    return [
        Unit(f"{prompt.id}|T={temperature:g}" + ("" if config is None else f"|{config.label}"), prompt,
             {"temperature": temperature} | ({} if config is None else {"config": config}))
        for temperature in temperatures
        for config in (configs or [None])
        for prompt in prompts
    ]


class Study:
    """Base class of the studies (module docstring)."""

    name: ClassVar[str]
    help: ClassVar[str]  # from ``options.STUDY_OPTIONS`` (``register_study``)
    order: ClassVar[int]  # position in the report, from ``STUDY_OPTIONS``
    presets: ClassVar[dict] = {}  # name -> StudyPreset: ``--preset NAME`` (cli.study), from ``STUDY_OPTIONS``
    record_fields: ClassVar[RecordFields] = RecordFields()  # what its records hold, checked as they are read
    # (``records``), from ``STUDY_OPTIONS``

    @classmethod
    def from_arguments(cls, args: argparse.Namespace, generation: dict) -> Study:
        """The study the parsed options ask for; ``generation`` holds the common settings
        (temperatures, max_new_tokens, top_k, top_p)."""
        raise NotImplementedError

    def settings(self) -> dict:
        raise NotImplementedError

    def units(self, prompts: list[Prompt]) -> list[Unit]:
        raise NotImplementedError

    def begin(self, pair: ModelPair, units: list[Unit], directory: Path) -> None:
        """Called once a run's pair has loaded, before its pending units, with every unit of
        the run in order and its results folder (holding the units written before): a study
        whose units draw on earlier ones restores that state here (the acceptance study's
        suffix history). By default nothing."""

    def trace_request(self, pair: ModelPair, unit: Unit):
        """How the unit's text is generated (``traces.TraceRequest``); a study that decodes
        its units otherwise overrides ``run_unit`` instead (its units then run one by one)."""
        raise NotImplementedError

    def unit_output(self, pair: ModelPair, unit: Unit, request, trace) -> UnitOutput:
        """The unit's records from its generated ``trace``."""
        raise NotImplementedError

    def run_unit(self, pair: ModelPair, unit: Unit, generator: torch.Generator) -> UnitOutput:
        return self.run_units(pair, [unit], [generator])[0]

    def run_units(self, pair: ModelPair, units: list[Unit], generators: list[torch.Generator]) -> list[UnitOutput]:
        """The records of several units: units whose texts are generated alike decode
        together in one batch (``traces.generate_traces``) — each gets exactly the text it
        gets alone with its generator, so the records are those of one-by-one runs. The
        records are made in unit order, once every text is generated."""
        from specbound.studies.traces import check_one_tokenizer, generate_traces

        check_one_tokenizer(pair)
        if type(self).trace_request is Study.trace_request:  # decodes its own way: one by one
            return [type(self).run_unit(self, pair, unit, generator) for unit, generator in zip(units, generators)]
        requests = [self.trace_request(pair, unit) for unit in units]
        traces = [None] * len(units)
        groups: dict[tuple, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request.key, []).append(index)
        for indices in groups.values():
            generated = generate_traces(pair, requests[indices[0]],
                                        [pair.encode(units[i].prompt.text) for i in indices],
                                        [generators[i] for i in indices])
            for index, trace in zip(indices, generated):
                traces[index] = trace
        return [self.unit_output(pair, unit, request, trace) for unit, request, trace in zip(units, requests, traces)]

    def batch_key(self, unit: Unit):
        """Units with equal keys may run in one batch (the same generation settings)."""
        config = unit.config.get("config")
        return (unit.config.get("temperature"), getattr(config, "label", config))

    @staticmethod
    def summary_tables(results) -> list[tuple[str, tuple[list, list]]]:
        """(title, (headers, rows)) of the tables ``specbound study`` prints."""
        return []

    @classmethod
    def report_blocks(cls, studies: list, figure_dir: Path) -> list:
        """The report's sections for every results folder of this study (``document``
        blocks): by default one ``report_section`` per folder."""
        return [block for results in studies for block in cls.report_section(results, figure_dir)]

    @staticmethod
    def report_section(results, figure_dir: Path) -> list:
        """The report's section for one results folder."""
        return []


STUDIES: dict[str, type[Study]] = {}


def register_study(study_class: type[Study]) -> type[Study]:
    """Class decorator: add a study to ``STUDIES`` under its name, with the help, order,
    record fields, presets and ``add_arguments`` (its own options) of its entry in
    ``options.STUDY_OPTIONS``."""
    if study_class.name in STUDIES:
        raise ValueError(f"study: {study_class.name!r} is registered already")
    if study_class.name not in STUDY_OPTIONS:
        raise ValueError(f"study: {study_class.name!r} has no entry in studies.options.STUDY_OPTIONS")
    options = STUDY_OPTIONS[study_class.name]
    study_class.help, study_class.order, study_class.presets = options.help, options.order, options.presets
    study_class.record_fields = options.record_fields
    study_class.add_arguments = staticmethod(options.add_arguments)
    STUDIES[study_class.name] = study_class
    return study_class


def get_study(name: str) -> type[Study]:
    try:
        return STUDIES[name]
    except KeyError:
        raise ValueError(f"study: unknown study {name!r}; choose one of {sorted(STUDIES)}") from None
