"""The command line starts light: building the parser (every command's options) and refusing
a bad value import neither torch, transformers nor matplotlib, nor the engine or the studies
(``specbound.cli``: the handlers import what they call). Checked in a fresh interpreter,
where nothing is imported yet."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "matplotlib", "specbound.engine", "specbound.studies")
CALLS = [  # (arguments, exit status), each ended by argparse before any command runs
    (["--help"], 0),
    (["accept", "-n", "0"], 2),
    (["bounds", "optimum", "-n", "x"], 2),
    (["generate", "--top-p", "2"], 2),
    (["serve", "--port", "70000"], 2),
]
CODE = f"""
import contextlib, io, sys
from specbound.cli import build_parser, main
build_parser()
for arguments, status in {CALLS!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(arguments)
        except SystemExit as ended:
            assert ended.code == status, (arguments, ended.code)
        else:
            raise AssertionError(f"{{arguments}} was not refused")
print(" ".join(name for name in {HEAVY!r} if name in sys.modules))
"""


def test_building_the_parser_and_refusing_a_value_import_nothing_heavy():
    finished = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split() == []
