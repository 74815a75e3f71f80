"""``main``: the parser of every subcommand, and the one place where failures become an error line and an exit code.

Exit codes: 0 success, 1 bad input or a failure of ours (one ``error: [component] ...`` line on stderr; a
traceback only with ``UAII_DEBUG=1``), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from uaii.ir import UaiiError

from . import bench, chat, generate, model, system
from .context import CliError, Context, SessionFactory

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130

# (module, function that adds its subcommands) in the order `uaii --help` lists them
_COMMANDS: tuple[Callable[[Any], None], ...] = (
    generate.add_parsers, chat.add_parsers, model.add_parsers, bench.add_parsers, system.add_parsers,
)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error: [cli] ...`` line and exit code 1, like every other error."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    from uaii.runtime import __version__

    ap = _Parser(prog="uaii", description="UAII: storage-first LLM inference. `uaii COMMAND --help` for details.")
    ap.add_argument("--version", action="version", version=f"uaii {__version__}")
    ap.add_argument("--no-color", action="store_true", help="plain output: no colors or progress animations "
                    "(also when NO_COLOR is set or the output is not a terminal)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    for command in sub.choices.values():  # also accepted after the command: `uaii devices --no-color`
        command.add_argument("--no-color", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return ap


class _LevelPrefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def setup_logging() -> None:
    """Library log records on stderr as ``warning: [runtime] ...``; UAII_DEBUG=1 adds info, 2 debug."""
    logger = logging.getLogger("uaii")
    if any(getattr(h, "_uaii_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()  # sys.stderr at the time of each record
    handler.setFormatter(_LevelPrefix())
    handler._uaii_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    level = debug_level()
    logger.setLevel(logging.DEBUG if level >= 2 else logging.INFO if level == 1 else logging.WARNING)


def debug_level() -> int:
    raw = os.environ.get("UAII_DEBUG", "").strip()
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 1


def main(argv: Sequence[str] | None = None, *, session_factory: SessionFactory | None = None) -> int:
    """Run ``uaii`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    ctx: Context | None = None
    try:
        args = build_parser().parse_args(argv)
        setup_logging()
        ctx = Context.create(no_color=args.no_color, session_factory=session_factory)
        return int(args.func(args, ctx) or EXIT_OK)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _flush_quietly()
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `uaii run ... | head`: the reader left, nothing to report
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:
        if debug_level() > 0:
            raise
        _flush_quietly()
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if ctx is not None:
            ctx.close()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, UaiiError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"[io] {exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, MemoryError):
        text = "[runtime] out of memory; try a smaller --preset or --budget"
    else:
        text = f"[internal] {type(exc).__name__}: {exc} (UAII_DEBUG=1 shows the traceback)"
    return " ".join(text.split()) or type(exc).__name__


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "build_parser", "main"]
