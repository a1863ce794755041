"""Make example generation independent of where the engine, the binding file and rlconform live.

Since 6.131, hypothesis mixes *local constants* into generation: with probability 5–15 % a drawn
integer, float or string is taken from the literals of every imported module whose file is "local",
i.e. not under site-packages or the standard library (``hypothesis.internal.conjecture.providers.
_get_local_constants``, ``hypothesis.internal.constants_ast.is_local_module_file``). Which modules are
local depends on where things live: an engine checked out outside site-packages
(``--engine-path``), an editable install of rlconform, a binding file, even a folder named ``test``
on the path. The derandomized seed (the digest of the test function and the finding id) is the same
everywhere, but from the first constant drawn on, the examples differ, and so do borderline verdicts
(``token_logprobs.matches_reference.float32.neg_inf_padded`` at 2.88e-6 vs a tolerance of
2.59e-6 with a byte-identical copy of verl). It also writes a constants cache under ``./.hypothesis``.

:func:`pin_generation` replaces the local-constant pool by an empty one, so generation draws only
from hypothesis' fixed global constants and the seed: the same examples for the same engine code,
whatever its path, the output folder or the working directory.
"""

from __future__ import annotations


def pin_generation() -> bool:
    """Disable hypothesis' local-constant pool (idempotent). Returns True when it was pinned, False with
    a hypothesis version that has no such pool (nothing to do)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - hypothesis always has it; layout may change
        return False
    current = getattr(providers, "_get_local_constants", None)
    if current is None or not hasattr(providers, "Constants"):
        return False
    if getattr(current, "_rlconform_pinned", False):
        return True
    empty = providers.Constants()

    def _no_local_constants():
        return empty

    _no_local_constants._rlconform_pinned = True
    providers._get_local_constants = _no_local_constants
    return True
