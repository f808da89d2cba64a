"""``specbound serve`` refuses what it cannot serve safely before any model loads, exit
status 2 and one line naming the option: an empty API key (which would serve without
authentication), an address that does not resolve, a port another process holds; and it
warns when it would listen beyond this machine without a key."""

from __future__ import annotations

import socket
import time

import pytest

from specbound.cli import main
from specbound.serve.server import bind, exposure_warning

REFUSED_WITHIN = 10  # seconds: no model loads before the refusal


def refusal(capsys, arguments: list[str]) -> str:
    started = time.monotonic()
    try:
        status = main(["serve", *arguments])
    except SystemExit as ended:  # argparse's own refusal
        status = ended.code
    assert status == 2
    assert time.monotonic() - started < REFUSED_WITHIN
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[-1]


@pytest.mark.parametrize("key", ["", "two words"])
def test_an_empty_or_unsendable_api_key_is_refused(capsys, key):
    assert "--api-key" in refusal(capsys, ["--api-key", key])


def test_an_empty_key_in_the_environment_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("SPECBOUND_API_KEY", "")
    assert "SPECBOUND_API_KEY" in refusal(capsys, ["--port", "0"])


def test_an_address_that_does_not_resolve_is_refused_before_the_models_load(capsys):
    assert "--host" in refusal(capsys, ["--host", "999.1.1.1"])


def test_a_port_in_use_is_refused_before_the_models_load(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert "--port" in refusal(capsys, ["--host", "127.0.0.1", "--port", str(taken.getsockname()[1])])


@pytest.mark.parametrize("host, key, warned", [("127.0.0.1", None, False), ("0.0.0.0", "k", False),
                                               ("0.0.0.0", None, True)])
def test_listening_beyond_this_machine_without_a_key_is_warned_of(host, key, warned):
    listener = bind(host, 0)  # bound, never listening: nothing is exposed
    try:
        warning = exposure_warning(listener, key)
    finally:
        listener.close()
    assert (warning is not None) == warned and (not warned or "--api-key" in warning)
