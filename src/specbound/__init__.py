"""specbound: speculative decoding with its theory built in.

Convention everywhere (SPEC.md §0): *target* = the large model's distribution p,
*draft* = the small model's distribution q.
"""

__version__ = "0.1.0"


def __getattr__(name):
    """``specbound.Speculator`` and ``specbound.generate`` (``specbound.api``), loaded on
    first use: importing the package stays light."""
    if name in ("Speculator", "generate", "Result"):
        from specbound import api

        return getattr(api, name)
    raise AttributeError(f"module 'specbound' has no attribute {name!r}")
