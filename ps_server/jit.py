"""One switch for every numba-compiled pass: ``SPARK_PS_NO_JIT``.

Set to anything but ``""`` or ``"0"``, the key passes (:mod:`ps_server.keys_jit`), the
shards' GBT split search (:mod:`ps_server.functions.gbt_jit`), the workers' tree kernels
(``spark_ps.ml.tree.kernels``) and LR's threaded row blocks (``spark_ps.ml.lr.row_blocks``)
take their numpy (or one-thread scipy) paths instead. Each reads it once, when it
would first compile.
"""

from __future__ import annotations

import os

__all__ = ["NO_JIT_ENV", "compiled", "jit_wanted"]

NO_JIT_ENV = "SPARK_PS_NO_JIT"


def jit_wanted() -> bool:
    """Whether to compile with numba: False when ``SPARK_PS_NO_JIT`` is set to anything
    but ``""`` or ``"0"`` (numba itself may still be missing: callers fall back then too)."""
    return os.environ.get(NO_JIT_ENV, "") in ("", "0")


def compiled(*functions):
    """`functions` compiled with numba (``cache=True, nogil=True``), as a tuple, or None
    when the switch is set or numba is missing (callers take their uncompiled path)."""
    if not jit_wanted():
        return None
    try:
        from numba import njit
    except ImportError:
        return None
    jit = njit(cache=True, nogil=True)
    return tuple(jit(f) for f in functions)
