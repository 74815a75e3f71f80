"""The ``uaii`` command line: run, chat, tokenize, detokenize, inspect, convert, bench, devices, cache, plan, presets.

``main(argv)`` returns the exit code (the console script calls it). One module per group of commands; every
command is documented with an example in docs/cli.md.

Nothing heavy is imported here: ``main`` imports the commands (numpy, rich, the kernels) inside its own Ctrl-C
handler, so an interrupt during start-up ends like one during work — ``interrupted``, exit 130, no traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

EXIT_INTERRUPTED = 130  # app.EXIT_INTERRUPTED, without importing app before the handler is in place


def main(argv: Sequence[str] | None = None, **kwargs: Any) -> int:
    """Run ``uaii`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code (see :mod:`.app`)."""
    try:
        from uaii.runtime.cli.app import main as run
    except KeyboardInterrupt:
        if sys.stderr is not None:
            print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return run(argv, **kwargs)


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

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE", "CliError", "build_parser", "main"]
