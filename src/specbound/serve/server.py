"""Listening and shutting down: the address bound before the models load, the drain on SIGTERM.

``bind`` resolves ``--host`` and binds ``--port`` at once, so that a bad address is refused
in a second, naming its option, and no other process can take the port while the models
load; the socket listens only once the server starts (until then a connection is refused).

``run`` serves an application on uvicorn. On SIGTERM or Ctrl-C uvicorn stops accepting
connections and waits for the responses in flight; the decoding loop is told to drain at
the same moment (``BatchingLoop.drain``), so that when ``drain_seconds`` are up it ends every
unfinished request itself — a stream with an error event and ``[DONE]``, its body
terminated — before uvicorn's own deadline (``DRAIN_GRACE`` later) would cut connections.

Before serving, the objects loaded so far (models, tokenizer, libraries: millions) are
frozen out of the garbage collector's reach (``gc.freeze``): a full collection would
otherwise walk them all, stopping every thread — ``/health`` included — for a large part of
a second.
"""

from __future__ import annotations

import errno
import gc
import ipaddress
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # bind imports nothing heavy: it runs before the models load
    from specbound.serve.batching import BatchingLoop

DRAIN_GRACE = 3.0  # seconds uvicorn waits beyond the drain for the ended responses to be sent


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port``, not listening yet; a ValueError naming
    ``--host`` (it does not resolve, or is not this machine's) or ``--port`` (taken, or not
    allowed) otherwise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses
    try:
        socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"--host: cannot resolve {host!r} ({getattr(error, 'strerror', None) or error})") from None
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        option = "--host" if error.errno == errno.EADDRNOTAVAIL else "--port"
        raise ValueError(f"{option}: cannot listen on {host} port {port} ({error.strerror})") from None
    return listener


def exposure_warning(listener: socket.socket, api_key: str | None) -> str | None:
    """A warning when ``listener`` takes connections from other machines and no key is asked."""
    address = listener.getsockname()[0]
    if api_key is not None or ipaddress.ip_address(address).is_loopback:
        return None
    return (f"warning: listening on {address} without --api-key: anyone who can reach this machine can use the "
            "server")


def run(app, loop: BatchingLoop, listener: socket.socket, drain_seconds: float, log_level: str) -> bool:
    """Serve ``app`` on ``listener`` until SIGTERM or Ctrl-C, then drain (module docstring);
    whether the server had started."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            loop.drain(drain_seconds)
            await super().shutdown(sockets)

    gc.collect()
    gc.freeze()  # what is loaded stays: a full collection while serving scans only what came after
    host, port = listener.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=drain_seconds + DRAIN_GRACE)
    server = DrainingServer(config)
    server.run(sockets=[listener])
    return server.started
