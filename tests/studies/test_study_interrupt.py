"""Ctrl-C stops a study whatever Python runs when it lands — also inside llama.cpp's log
callback, where ctypes cannot pass the KeyboardInterrupt back through C and reported it to
``sys.unraisablehook`` instead: the run went on to its end (``engine.backends.interrupts``)."""

import signal
import subprocess
import sys
import time

import pytest

from support.models import tiny_model
from specbound.models.tiny import write_gguf

pytest.importorskip("llama_cpp")

INTERRUPTED_STATUS = 130
# llama.cpp at work much as a study's start keeps it, and most of that time inside C code
# that calls the log callback: loading a model logs a few dozen lines.
LOADING = """
import sys, time
from specbound.engine.backends.llamacpp import LlamaCppModel
LlamaCppModel(sys.argv[1], threads=1)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
try:
    while time.monotonic() < deadline:
        LlamaCppModel(sys.argv[1], threads=1)
except KeyboardInterrupt:
    sys.exit(130)
"""


def as_from_a_terminal() -> None:
    """In the child before exec: SIGINT at its default and unblocked, as a shell starts a
    foreground command. A process inherits an ignored or blocked SIGINT from its parent (a
    test runner's worker may hold one), and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("attempt", range(2))
def test_ctrl_c_while_llama_cpp_logs_stops_the_run(tmp_path, attempt):
    path = write_gguf(tiny_model(seed=0), tmp_path / "tiny.gguf")
    run = subprocess.Popen([sys.executable, "-c", LOADING, str(path), "10"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    try:
        assert run.stdout.readline().strip() == "ready"
        time.sleep(0.2 + 0.1 * attempt)
        run.send_signal(signal.SIGINT)
        started = time.monotonic()
        status = run.wait(timeout=30)
        inherited = (signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        assert status == INTERRUPTED_STATUS, (f"parent's SIGINT handler, blocked: {inherited}",
                                              run.stderr.read()[-2000:])
        assert time.monotonic() - started < 5
    finally:
        run.kill()
        run.wait()
