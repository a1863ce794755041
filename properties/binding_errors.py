"""A binding's own error, told apart from an engine crash.

When an op's call raises ``TypeError``, ``AttributeError``, ``ImportError`` (``ModuleNotFoundError``) or
``NameError`` and the innermost Python frame of the traceback is the binding's code — a file of
``rlconform/harness/bindings/`` or the file of one of the binding's ``Lazy`` loaders or ``adapt``
functions (an adapter) — the
adapter does not fit the installed engine (``agg_loss() got an unexpected keyword argument 'dp_size'``,
``module 'verl.utils' has no attribute 'metric'``): the finding's status is ``binding_error``, not
``crash``, with the engine's version and the missing name, and it is no engine defect. The same exception
raised with an engine frame innermost (the engine's own code failed) stays a ``crash``. A call into a C
function (``torch.cat(...)``) has no Python frame of its own: the caller's frame is the innermost one.
"""

from __future__ import annotations

import os
import re
import types

#: exception types an adapter raises when it does not fit the engine version
ADAPTER_TYPES = (TypeError, AttributeError, ImportError, NameError)
_BINDINGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness", "bindings") + os.sep
_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_.]*)'")


def binding_files(binding) -> set[str]:
    """The files whose frames are the binding's: the files of its ``Lazy`` loaders and ``adapt`` functions
    (the adapters live there)."""
    from rlconform.harness.catalog.binding import Lazy

    files = set()
    for impl in list(getattr(binding, "ops", {}).values()) + [
            i.fn for impls in getattr(binding, "implementations", {}).values() for i in impls.values()]:
        for fn in ((impl.loader, impl.adapt) if isinstance(impl, Lazy) else ()):
            code = getattr(fn, "__code__", None)
            if code is not None:
                files.add(os.path.abspath(code.co_filename))
    return files


def innermost_file(exc: BaseException) -> str | None:
    """The file of the innermost Python frame of ``exc``'s traceback (None without one)."""
    tb: types.TracebackType | None = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return os.path.abspath(last.tb_frame.f_code.co_filename) if last is not None else None


def missing_name(exc: BaseException) -> str | None:
    """The name the engine lacks: ``exc.name`` (ImportError, AttributeError, NameError), else the last
    quoted identifier of the message (``unexpected keyword argument 'dp_size'`` -> ``dp_size``)."""
    name = getattr(exc, "name", None)
    if isinstance(name, str) and name:
        return name
    found = _QUOTED.findall(str(exc))
    return found[-1] if found else None


def adapter_error(binding, where: str, exc: BaseException) -> str | None:
    """The one-line ``binding_error`` message when ``exc`` (raised by the call ``where``) is the adapter's own
    error (see the module doc), else None."""
    if not isinstance(exc, ADAPTER_TYPES):
        return None
    path = innermost_file(exc)
    if path is None or not (path.startswith(_BINDINGS_DIR) or path in binding_files(binding)):
        return None
    version = getattr(binding, "version", None) or "version unknown"
    name = missing_name(exc)
    return (f"binding error in {where} ({getattr(binding, 'name', 'engine')} {version}): "
            f"{type(exc).__name__}: {exc} (" + (f"missing name: {name}; " if name else "")
            + f"adapter frame {os.path.basename(path)}; not an engine defect)")
