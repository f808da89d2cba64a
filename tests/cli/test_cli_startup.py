"""The command line starts light: building the parser (every command's options) and refusing
a bad value import neither torch, transformers, llama.cpp, matplotlib, numba nor scipy
(``specbound.cli``: the handlers import what they call); the math commands (``accept``,
``bounds``, ``theory``) run to their end without torch. Checked in a fresh interpreter,
where nothing is imported yet."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "llama_cpp", "matplotlib", "numba", "scipy")
CALLS = [  # (arguments, exit status), each ended by argparse before any command runs
    (["--help"], 0),
    (["accept", "-n", "0"], 2),
    (["bounds", "optimum", "-n", "x"], 2),
    (["generate", "--top-p", "2"], 2),
    (["serve", "--port", "70000"], 2),
    (["study", "nope"], 2),  # the studies' names and options are read without the studies (studies.options)
    (["study", "bias", "--gamma", "0"], 2),
    (["study", "acceptance", "--preset", "nope"], 2),
    (["study", "acceptance", "--help"], 0),
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


MATH_CALLS = [  # the math commands, each run to its end on small sizes
    ["accept", "--target", "0.6,0.4", "--draft", "0.5,0.5", "-n", "2"],
    ["accept", "--target", "0.6,0.3,0.1", "--draft", "0.2,0.3,0.5", "-n", "3", "--json"],
    ["bounds", "optimum", "-n", "3"],
    ["bounds", "plot", "--max-drafts", "2", "--json"],
    ["theory", "convergence", "--horizon", "4", "--vocab", "3", "--runs", "20", "--lookaheads", "2"],
    ["theory", "drafts", "--horizon", "4", "--vocab", "3", "--max-drafts", "4", "--simulated-drafts", "1,2",
     "--runs", "20"],
    ["theory", "improvement", "--max-drafts", "3"],
    ["theory", "pareto", "--random-points", "5", "--json"],
]
MATH_CODE = """
import contextlib, io, sys
from specbound.cli import main
out = sys.argv[1]
for arguments in {calls!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as errors:
        status = main(arguments + ["--out", out] if arguments[0] != "accept" and arguments[1] != "optimum"
                      else arguments)
    assert status == 0, (arguments, status, errors.getvalue())
print(" ".join(name for name in ("torch", "transformers", "llama_cpp") if name in sys.modules))
"""


def test_the_math_commands_run_without_importing_torch(tmp_path):
    """``accept``, ``bounds`` and ``theory`` compute with numpy alone: the math layers import
    torch only inside their torch paths (``probability.is_tensor``)."""
    code = MATH_CODE.format(calls=MATH_CALLS)
    finished = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split() == []
