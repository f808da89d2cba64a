"""Nothing the reorganisation moved changed a number: the command line, the engine and the
studies reproduce the outputs recorded before it (``tests/support/golden.py``, run on the
code before the move).

Token ids, counts, names and reasons must be identical; floats must agree to 1e-12 (a
formula written once instead of several times may round its last bit differently, far
below every tolerance the math states). Records are matched by name, not by position.

The intended changes, each a consequence of reading one registry, are listed in
``INTENDED_CHANGES`` and removed from both sides before comparing:
- every draft scheme has its α* row, so SpecHub pairs gained one (``optimal α* (spechub)``
  in ``accept``, ``optimum/spechub`` in ``bounds plot``, ``optimal_spechub`` in the
  acceptance study), and α* rows say their number of drafts;
- a verifier with its own number of drafts is evaluated at it everywhere, as the study did
  already: ``accept`` now shows SpecHub at n = 2 (it said "not applicable" for n ≠ 2);
- a verifier registered later, Global Resolution (issue 41), is a new row of ``accept``, of
  ``bounds plot`` and of the acceptance study, leaving every other number as it was;
- the engine's probability rows are renormalised by a float64 sum (a float32 softmax over
  151,936 logits sums to 1 only within ~5e-5, which min(1, p/q) would carry as a bias): the
  studies' exact numbers, computed from those rows, move by at most ``STUDY_TOLERANCE``; the
  tokens are unchanged.

The tiny pair's forwards run in float32, and torch's float32 kernels round differently by
the CPU's vector width (AVX2 against AVX-512: the same tokens, rows that differ in their
last bits), so the studies' floats may also move by ``FLOAT32_KERNELS`` of their value, 64
float32 ulps: the records were made on an AVX-512 machine and must hold on every CPU CI
may run on.

One later change re-recorded the engine's tokens and the studies' records (and nothing
else): the draft schemes' torch samplers draw by inverse CDF from one running sum, with
float32 uniforms, as their numpy twins do, instead of ``torch.multinomial`` (~3 ms on a
151,936-token row against ~0.2 ms) — the same law, so other tokens for a given seed. A
second one re-recorded the tokens of the trees drafted without replacement (only those):
their torch sampler draws sequentially by inverse CDF, each draft from q with the earlier
ones zeroed, instead of an exponential race (one exponential per token, ~3.5 ms a row) —
the same law, other tokens for a given seed.
"""

import json
import math

import pytest

from support.golden import GOLDEN_FILE, command_outputs, engine_outputs, study_outputs

FLOAT_TOLERANCE = 1e-12
STUDY_TOLERANCE = 1e-7
FLOAT32_KERNELS = 64 * 2.0 ** -23  # relative: the float32 forward's last bits, CPU by CPU
GOLDEN = json.loads(GOLDEN_FILE.read_text())


def differences(recorded, produced, path="", tolerance=FLOAT_TOLERANCE, relative=0.0) -> list[str]:
    """Where ``produced`` differs from ``recorded`` (JSON values), as readable paths: floats
    by more than ``tolerance`` plus ``relative`` of the recorded value."""
    if isinstance(recorded, float) or isinstance(produced, float):
        if isinstance(recorded, (int, float)) and isinstance(produced, (int, float)):
            if math.isnan(recorded) and math.isnan(produced):
                return []
            if abs(recorded - produced) <= tolerance + relative * abs(recorded):
                return []
        return [f"{path}: {recorded!r} -> {produced!r}"]
    if isinstance(recorded, dict) and isinstance(produced, dict):
        found = [f"{path}/{key}: missing" for key in recorded.keys() - produced.keys()]
        found += [f"{path}/{key}: new" for key in produced.keys() - recorded.keys()]
        for key in recorded.keys() & produced.keys():
            found += differences(recorded[key], produced[key], f"{path}/{key}", tolerance, relative)
        return found
    if isinstance(recorded, list) and isinstance(produced, list):
        if len(recorded) != len(produced):
            return [f"{path}: length {len(recorded)} -> {len(produced)}"]
        return [line for index, (a, b) in enumerate(zip(recorded, produced))
                for line in differences(a, b, f"{path}[{index}]", tolerance, relative)]
    return [] if recorded == produced else [f"{path}: {recorded!r} -> {produced!r}"]


INTENDED_CHANGES = {
    "accept rows": {"optimal α* (spechub)", "spechub", "global_resolution"},
    "α* row keys": {"num_drafts"},
    "bounds plot optima": {"spechub"},
    "bounds plot verifiers": {"global_resolution"},
    "study methods": {"optimal_spechub", "global_resolution"},
}


def without_intended_changes(name: str, output):
    """``output`` with ``INTENDED_CHANGES`` removed, method rows keyed by name."""
    output = json.loads(json.dumps(output))
    if name.startswith("accept"):
        rows = {}
        for row in output["methods"]:
            if row["method"] in INTENDED_CHANGES["accept rows"]:
                continue
            if row["method"].startswith("optimal α*"):
                row = {key: value for key, value in row.items() if key not in INTENDED_CHANGES["α* row keys"]}
            rows[row["method"]] = row
        output["methods"] = rows
    elif name.startswith("bounds plot"):
        output["optimum"] = {k: v for k, v in output["optimum"].items() if k not in INTENDED_CHANGES["bounds plot optima"]}
        output["verifiers"] = {k: v for k, v in output["verifiers"].items()
                               if k not in INTENDED_CHANGES["bounds plot verifiers"]}
    elif name.startswith("study"):
        for record in output["positions"]:
            for method in INTENDED_CHANGES["study methods"]:
                record.get("acceptance", {}).pop(method, None)
    return output


def check(produced: dict) -> None:
    found = []
    for name, value in produced.items():
        study = name.startswith("study")
        found += differences(without_intended_changes(name, GOLDEN[name]), without_intended_changes(name, value), name,
                             STUDY_TOLERANCE if study else FLOAT_TOLERANCE, FLOAT32_KERNELS if study else 0.0)
    assert not found, f"{len(found)} differences, e.g.\n" + "\n".join(found[:20])


def test_the_command_line_reproduces_its_golden_outputs():
    check(command_outputs())


def test_the_engine_reproduces_its_golden_tokens():
    check(engine_outputs())


def test_the_studies_reproduce_their_golden_records():
    check(study_outputs())


def test_the_comparison_can_fail():
    assert differences({"a": [1, 2.0]}, {"a": [1, 2.0 + 1e-9]}) == ["/a[1]: 2.0 -> 2.000000001"]
    assert differences({"a": 4.0}, {"a": 4.0 + 3e-5}, relative=FLOAT32_KERNELS) == []
    assert differences({"a": 4.0}, {"a": 4.0 + 4e-5}, relative=FLOAT32_KERNELS) != []
    assert differences({"a": 0.0}, {"a": 2e-7}, tolerance=STUDY_TOLERANCE, relative=FLOAT32_KERNELS) != []
    assert differences({"a": 1}, {"b": 1}) != []
    with pytest.raises(AssertionError):
        check({"accept A n=2": {"methods": []}})
