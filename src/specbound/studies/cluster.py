"""Reaching a Ray cluster before anything else runs: whether ray is installed, and whether
an address answers. Imports neither torch nor ray at module level, so ``specbound study``
refuses an unreachable ``--ray`` before the studies load (``distributed`` runs them there)."""

from __future__ import annotations

import socket

INSTALL_HINT = "ray is not installed: pip install 'specbound[distributed]'"
NAMED_ADDRESSES = ("local", "auto")  # ray.init's names: a new local instance, the cluster found here
CONNECT_SECONDS = 5.0  # a cluster's head answers a TCP connection at once; ray.init retries for minutes


def check_reachable(address: str | None, option: str = "address") -> None:
    """Refuse (ValueError naming ``option``) a HOST:PORT or ray://HOST:PORT ``address`` where
    nothing accepts a TCP connection within ``CONNECT_SECONDS``: ``ray.init`` would retry
    there for minutes, saying nothing. None and the named addresses are left to ``ray.init``."""
    if address is None or address in NAMED_ADDRESSES:
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except (OSError, ValueError) as error:
        reason = (f"no answer within {CONNECT_SECONDS:g} s" if isinstance(error, TimeoutError)
                  else getattr(error, "strerror", None) or error)
        raise ValueError(f"{option}: no Ray cluster at {address} ({reason}); give {option} the address "
                         "of a running cluster (ray start --head prints it)") from None


def import_ray():
    """The ``ray`` module, or a ValueError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray
