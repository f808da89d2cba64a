"""The suite's own scheduling (tests/conftest.py): every group it starts first names tests that
exist, so a renamed or moved file cannot silently drop out of the longest-first order."""

from pathlib import Path

TESTS = Path(__file__).parent


def test_every_longest_group_names_a_test_file_or_folder(request):
    # tests/conftest.py as pytest loaded it (``import conftest`` may find another folder's)
    conftest = next(plugin for plugin in request.config.pluginmanager.get_plugins()
                    if getattr(plugin, "__file__", None) == str(TESTS / "conftest.py"))
    missing = [group for group in conftest.LONGEST_GROUPS if not (TESTS / group).exists()]
    assert not missing, missing
    assert len(set(conftest.LONGEST_GROUPS)) == len(conftest.LONGEST_GROUPS)
