"""Ctrl-C that lands in a C library's callback into Python, raised again where it is heard.

Python runs a signal's handler between bytecodes of the main thread, so a SIGINT that
arrives while llama.cpp works raises KeyboardInterrupt in the first Python code that runs
next — often llama.cpp's log callback (``llamacpp._drop_below_errors``), which C calls
through ctypes. ctypes cannot pass an exception back through C: it hands it to
``sys.unraisablehook`` and returns, and the interrupt is lost.

``hear_swallowed_interrupts`` installs a hook that answers such a KeyboardInterrupt by
interrupting the main thread again (``_thread.interrupt_main``) from a short-lived thread,
once the hook has returned: the interrupt then lands in the main thread's next Python code —
ordinary code, where it propagates, or another callback, which hands it on again. Every
other unraisable exception goes to the hook that was there before.
"""

from __future__ import annotations

import _thread
import sys
import time

POLL_SECONDS = 0.001


def hear_swallowed_interrupts() -> None:
    """Install the hook (module docstring); installing it again changes nothing."""
    if getattr(sys.unraisablehook, "hears_interrupts", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
            return
        returned = [False]
        _thread.start_new_thread(_interrupt_main_after, (returned,))  # returns at once, unlike threading's start
        returned[0] = True  # a store, no call: nothing runs a signal handler between here and the return

    hook.hears_interrupts = True
    sys.unraisablehook = hook


def _interrupt_main_after(returned: list[bool]) -> None:
    """Interrupt the main thread once the hook has returned (an interrupt raised in the hook
    itself would be lost as well)."""
    while not returned[0]:
        time.sleep(POLL_SECONDS)
    time.sleep(POLL_SECONDS)
    _thread.interrupt_main()
