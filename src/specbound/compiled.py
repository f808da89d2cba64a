"""Compiled loops: numba's ``njit``, its machine code cached in a folder named for the source.

The hot loops of the exact computations (the race, the tail cut, the scan order, K-SEQ,
RRS, the closed forms) are ``compiled`` functions: numba compiles each Python loop to
machine code on its first call and keeps that on disk. numba checks a cached loop against
its own file only, so a loop that calls another module's loop (``probability.pairwise_sum``
from ``drafts.greedy`` and ``verifiers.kseq``) would keep the callee's old machine code
after the callee changed — a wrong value or a crash. The cache folder is therefore
``<cache>/numba/<digest>`` (``paths.default_cache_dir``), the digest of the source of
every module of the package that holds ``compiled`` loops: any change to any of them
compiles afresh, into a new folder. Only these loops' cache moves; numba's setting for
anything else stays as it was.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numba

MARK = b"@compiled"  # how the modules holding compiled loops are found


def compiled(function=None, **options):
    """``numba.njit(cache=True, **options)`` cached in ``cache_folder()``; as ``@compiled`` or
    ``@compiled(error_model="numpy")``."""
    if function is None:
        return lambda function: compiled(function, **options)
    previous = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(cache_folder())  # read once, when the loop is declared
    try:
        return numba.njit(cache=True, **options)(function)
    finally:
        numba.config.CACHE_DIR = previous


@cache
def cache_folder() -> Path:
    """``<cache>/numba/<digest of the modules holding compiled loops>``."""
    from specbound.paths import default_cache_dir

    package = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        source = path.read_bytes()
        if MARK in source:
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + source)
    return default_cache_dir() / "numba" / digest.hexdigest()[:16]
