"""Array namespaces that let a rule be written once and run on every backend.

A rule is a plain Python function built by a ``make_*(xp)`` factory. ``xp`` is one of

* :mod:`popplay.xp.nb` — numba scalars: ``xp.fn`` jit-compiles each piece, so a
  rule becomes an inlinable scalar function called from fused parallel loops;
* :mod:`popplay.xp.th` — torch tensors, batched over the population on CPU or CUDA;
* :mod:`popplay.xp.py` — plain Python scalars, used by the slow reference tests.

Rules use only operators that agree bit for bit across the three (integer mixing with
explicit wrapping, IEEE ``+ - * /``, ``floor``, ``frexp``); ``xp.vectorized`` tells a
rule whether it may branch (scalars) or must select with ``where`` (tensors).
"""
