"""The suite's own scheduling (tests/conftest.py): every group it starts first names tests that
exist, so a renamed or moved file cannot silently drop out of the longest-first order."""

from pathlib import Path

from conftest import LONGEST_GROUPS

TESTS = Path(__file__).parent


def test_every_longest_group_names_a_test_file_or_folder():
    missing = [group for group in LONGEST_GROUPS if not (TESTS / group).exists()]
    assert not missing, missing
    assert len(set(LONGEST_GROUPS)) == len(LONGEST_GROUPS)
