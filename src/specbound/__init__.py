"""specbound: speculative decoding with its theory built in.

Convention everywhere (SPEC.md §0): *target* = the large model's distribution p,
*draft* = the small model's distribution q.
"""

__version__ = "0.1.0"
