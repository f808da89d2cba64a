"""What a study's results hold, field by field, as JSON gives them back: the kinds of value a
field may hold (``Kind``) and a study's declaration of its records' and settings' fields
(``RecordFields``, ``Study.record_fields``), which ``records`` checks as it reads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Kind:
    """What a record field holds, as JSON gives it back: ``accepts`` a value or not."""

    phrase: str  # "an integer"
    plural: str  # "integers"
    accepts: Callable[[object], bool]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


INTEGER = Kind("an integer", "integers", lambda value: _is_number(value) and isinstance(value, int))
NUMBER = Kind("a number", "numbers", _is_number)
TEXT = Kind("a string", "strings", lambda value: isinstance(value, str))
MAPPING = Kind("an object", "objects", lambda value: isinstance(value, dict))


def optional(kind: Kind) -> Kind:
    return Kind(f"{kind.phrase} or null", f"{kind.plural} or nulls", lambda value: value is None or kind.accepts(value))


def list_of(kind: Kind) -> Kind:
    return Kind(f"a list of {kind.plural}", f"lists of {kind.plural}",
                lambda value: isinstance(value, list) and all(map(kind.accepts, value)))


def mapping_of(kind: Kind) -> Kind:
    return Kind(f"an object of {kind.plural}", f"objects of {kind.plural}",
                lambda value: isinstance(value, dict) and all(map(kind.accepts, value.values())))


@dataclass(frozen=True)
class RecordFields:
    """The fields of a study's records and their kinds (field -> ``Kind``), position records
    and run records apart, the fields that tell a unit's position records apart (``key``:
    two records of one unit with equal keys are one record written twice), and the study's
    own fields of ``settings.json``."""

    position: dict[str, Kind] = field(default_factory=dict)
    run: dict[str, Kind] = field(default_factory=dict)
    key: tuple[str, ...] = ()
    settings: dict[str, Kind] = field(default_factory=dict)


GENERATION_FIELDS = {"prompt_tokens": INTEGER, "tokens": list_of(INTEGER), "text": TEXT, "finish_reason": TEXT,
                     "engine": MAPPING}  # what ``traces.generation_summary`` gives a run record
GENERATION_SETTINGS = {"temperatures": list_of(NUMBER), "max_new_tokens": INTEGER, "top_k": optional(INTEGER),
                       "top_p": optional(NUMBER)}  # the settings ``traces.checked_generation_settings`` checks
