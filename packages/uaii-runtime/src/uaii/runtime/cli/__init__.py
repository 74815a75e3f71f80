"""The ``uaii`` command line: run, chat, tokenize, detokenize, inspect, convert, bench, devices, cache, plan, presets.

``main(argv)`` returns the exit code (the console script calls it). One module per group of commands; every
command is documented with an example in docs/cli.md.

Nothing heavy is imported here: ``main`` imports the commands (numpy, rich, the kernels) inside its own Ctrl-C
handler, so an interrupt during start-up ends like one during work — ``interrupted``, exit 130, no traceback.
While it runs, a Ctrl-C that lands where Python cannot raise it (:func:`redelivered_interrupts`) is delivered again.
"""

from __future__ import annotations

import _thread
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

EXIT_INTERRUPTED = 130  # app.EXIT_INTERRUPTED, without importing app before the handler is in place


def main(argv: Sequence[str] | None = None, **kwargs: Any) -> int:
    """Run ``uaii`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code (see :mod:`.app`)."""
    with redelivered_interrupts():
        try:
            from uaii.runtime.cli.app import main as run
        except KeyboardInterrupt:
            if sys.stderr is not None:
                print("\ninterrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return run(argv, **kwargs)


def _interrupt_soon(hook: Any) -> None:
    """SIGINT for the main thread once it has left ``hook`` (a KeyboardInterrupt raised while it is still inside,
    starting this thread, say, would be swallowed again): its stack is looked at every millisecond, up to a second
    (a slow machine can keep it there longer than any fixed pause)."""
    main = threading.main_thread().ident
    for _ in range(1000):
        frame = sys._current_frames().get(main) if main is not None else None
        while frame is not None and frame.f_code is not hook:
            frame = frame.f_back
        if frame is None:
            break
        time.sleep(0.001)
    _thread.interrupt_main()


@contextmanager
def redelivered_interrupts() -> Iterator[None]:
    """While inside, a KeyboardInterrupt that Python cannot raise where it lands — a weakref callback or a
    ``__del__``, such as importlib's module-lock callbacks during start-up — is delivered again as SIGINT instead
    of being printed as "Exception ignored ... KeyboardInterrupt" and lost (the run then went on as if no Ctrl-C
    had come): a moment later, from another thread, so that it lands in the main flow (one that lands in another
    such callback is delivered again). Other unraisable exceptions go to the hook that was there."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread, once this hook has returned: raised in it, it would be swallowed again
            threading.Thread(target=_interrupt_soon, args=(hook.__code__,), name="uaii-redeliver-sigint",
                             daemon=True).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def __getattr__(name: str) -> Any:
    if name in ("EXIT_ERROR", "EXIT_OK", "EXIT_PIPE", "build_parser"):
        from uaii.runtime.cli import app

        return getattr(app, name)
    if name == "CliError":
        from uaii.runtime.cli.context import CliError

        return CliError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from uaii.runtime.cli.app import EXIT_ERROR, EXIT_OK, EXIT_PIPE, build_parser
    from uaii.runtime.cli.context import CliError

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE", "CliError", "build_parser", "main",
           "redelivered_interrupts"]
