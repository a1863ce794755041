"""Real interrupts (Ctrl-C, SIGTERM) as opposed to a ``KeyboardInterrupt`` that engine code raised, and
interrupts that something swallowed.

Python turns SIGINT into a ``KeyboardInterrupt`` wherever the main thread happens to be; when that is a
callback whose exceptions are ignored (hypothesis' gc callback, a ``__del__``), the interrupt is lost and
the run goes on to finish green (2 of 11 SIGINTs). :func:`install` replaces the handlers of
SIGINT and SIGTERM with one that *records* the signal and then raises ``KeyboardInterrupt``; the run
calls :func:`check` at safe points (after every finding, after every fuzz example) and
:func:`received` at the end, so a swallowed interrupt still stops the run and is reported as one. Only
the first signal raises: a second Ctrl-C does not break the clean-up the first one started.

A ``KeyboardInterrupt`` while :func:`received` is None came from code, not from the user: the engine
raised it, and it is that finding's crash, not an interrupt of the run.

Processes that run engines for a controller (pytest-xdist workers) call :func:`ignore_sigint`: Ctrl-C
in a terminal reaches the whole process group, and only the controller acts on it (it ends the workers).
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["check", "engine_raised", "ignore_sigint", "install", "installed", "received", "reset", "uninstall"]

_received: list[int] = []
_previous: dict[int, object] = {}
_ignoring: list[bool] = []
_checked: list[bool] = []
_hook: list = []  # the unraisable hook install() found (one entry while installed)


def _unraisable(info) -> None:
    """An interrupt raised where exceptions are ignored (a gc callback) is recorded and re-raised at the next
    :func:`check`: Python's "Exception ignored … KeyboardInterrupt" report of it is not printed. Anything else
    goes to the hook that was in place."""
    if isinstance(info.exc_value, KeyboardInterrupt) and _received:
        return
    (_hook[0] if _hook else sys.__unraisablehook__)(info)


def _handler(signum, frame):
    first = not _received
    _received.append(signum)
    if first:  # a second Ctrl-C must not break the clean-up the first one started
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install(signals=(signal.SIGINT, signal.SIGTERM)) -> bool:
    """Record-then-raise handlers for ``signals``. True if this call installed them (the caller then
    calls :func:`uninstall`); False if they were in place already, or off the main thread."""
    if threading.current_thread() is not threading.main_thread() or _previous:
        return False
    for s in signals:
        _previous[s] = signal.getsignal(s)
        signal.signal(s, _handler)
    if not _hook:
        _hook.append(sys.unraisablehook)
        sys.unraisablehook = _unraisable
    return True


def uninstall() -> None:
    """Put the handlers back as :func:`install` found them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s, h in list(_previous.items()):
        signal.signal(s, h if h is not None else signal.SIG_DFL)
        del _previous[s]
    if _hook:
        sys.unraisablehook = _hook.pop()


def installed() -> bool:
    """Whether :func:`install` handlers are in place (so :func:`received` tells real interrupts apart)."""
    return bool(_previous)


def received() -> int | None:
    """The first interrupting signal received since :func:`install` / :func:`reset`, or None."""
    return _received[0] if _received else None


def reset() -> None:
    _received.clear()
    _checked.clear()


def check() -> None:
    """Raise ``KeyboardInterrupt`` if an interrupt was received (and perhaps swallowed); once."""
    if _received and not _checked:
        _checked.append(True)
        raise KeyboardInterrupt(f"signal {signal.Signals(_received[0]).name} (received earlier)")


def ignore_sigint() -> None:
    """For a process that runs engines under a controller: Ctrl-C is the controller's to handle."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _ignoring.append(True)


def engine_raised(exc: BaseException) -> bool:
    """Whether ``exc`` (a ``KeyboardInterrupt`` or ``SystemExit`` caught around engine code) is the
    engine's own doing rather than the user's interrupt: always for ``SystemExit``; for a
    ``KeyboardInterrupt`` when this process tells real interrupts apart (:func:`install`ed handlers, or
    SIGINT ignored) and none was received."""
    if isinstance(exc, SystemExit):
        return True
    if not isinstance(exc, KeyboardInterrupt):
        return False
    return received() is None and (installed() or bool(_ignoring))
