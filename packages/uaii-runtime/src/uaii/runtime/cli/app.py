"""``main``: the parser of every subcommand, and the one place where failures become an error line and an exit code.

Exit codes: 0 success, 1 bad input or a failure of ours (one ``error: [component] ...`` line on stderr, or a
short indented list under it for errors that are lists, such as a graph's validation diagnostics; a traceback only
with ``UAII_DEBUG=1``), 130 interrupted (Ctrl-C), 141 the reader of stdout left (``uaii run ... | head``: nothing
is printed, the status a shell reports for a program that SIGPIPE ended, as ``yes | head`` shows).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from uaii.ir import UaiiError

from . import bench, chat, generate, model, serve, system, verify
from .context import CliError, Context, SessionFactory, check_text

EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 130, 141
MAX_DETAIL_LINES = 12  # lines an error may add under its first one (the rest is counted, not shown)

# argument dest -> what it is, for the arguments that are text a tokenizer will see (never paths: a file name
# may be any bytes)
TEXT_ARGUMENTS = {"prompt": "the prompt (-p)", "system": "the system message (--system)", "stop": "--stop",
                  "text": "the text"}

# (module, function that adds its subcommands) in the order `uaii --help` lists them
_COMMANDS: tuple[Callable[[Any], None], ...] = (
    generate.add_parsers, chat.add_parsers, model.add_parsers, bench.add_parsers, system.add_parsers,
    verify.add_parsers, serve.add_parsers,
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
        return printable(f"{record.levelname.lower()}: {record.getMessage()}")


def printable(text: str) -> str:
    """``text`` with lone surrogates (a file name that is not UTF-8) as ``\\udcff``: writable to any stream."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record (a plain StreamHandler keeps the stream it was made with,
    which a later ``main()`` in the same process — tests, embedders — or a replaced closed stderr no longer is)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging() -> None:
    """Library log records on stderr as ``warning: [runtime] ...``; UAII_DEBUG=1 adds info, 2 debug."""
    logger = logging.getLogger("uaii")
    if any(getattr(h, "_uaii_cli", False) for h in logger.handlers):
        return
    handler = _StderrHandler()
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
        _check_std_streams()
        args = build_parser().parse_args(argv)
        check_text_arguments(args)
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
        return EXIT_PIPE
    except Exception as exc:
        if debug_level() > 0:
            raise
        _flush_quietly()
        print(f"error: {message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if ctx is not None:
            ctx.close()


def check_text_arguments(args: argparse.Namespace) -> None:
    """Every text argument must be valid UTF-8 (one rule for -p, --system, --stop and TEXT; see
    :func:`.context.check_text`), checked before any model is loaded."""
    for dest, what in TEXT_ARGUMENTS.items():
        value = getattr(args, dest, None)
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                check_text(text, what)


def message(exc: BaseException) -> str:
    """The error as the user sees it: its first line, then at most MAX_DETAIL_LINES indented lines of detail.

    Whitespace inside a line is collapsed (a message never breaks the terminal's layout); the lines an error
    chose to list (a validation failure's diagnostics) stay lines instead of one 3 KB line.
    """
    if isinstance(exc, UaiiError):
        text = str(exc)
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"[io] {exc.filename}: {exc.strerror or exc}"
    elif isinstance(exc, OSError) and exc.errno == errno.EBADF:
        text = f"[cli] cannot write the output: {exc.strerror} (stdout or stderr was closed)"
    elif isinstance(exc, MemoryError):
        text = "[runtime] out of memory; try a smaller --preset or --budget"
    else:
        text = f"[internal] {type(exc).__name__}: {exc} (UAII_DEBUG=1 shows the traceback)"
    first, *rest = [" ".join(line.split()) for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    if len(rest) > MAX_DETAIL_LINES:
        rest = [*rest[:MAX_DETAIL_LINES - 1], f"... and {len(rest) - MAX_DETAIL_LINES + 1} more lines"]
    return printable("\n".join([first, *("  " + line for line in rest)]))


def _check_std_streams() -> None:
    """A stream closed before we started (``>&-``, ``2>&-``) is None in Python: stderr then discards what we
    write (there is nowhere to report), and a closed stdout is an error said on stderr before any work."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (lives as long as the process, like sys.stderr)
    if sys.stdout is None:
        raise CliError("stdout is closed (file descriptor 1); uaii writes its results there: redirect it to a file "
                       "or to /dev/null instead of closing it")


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
    except AttributeError:  # closed when we started: None
        pass


def _silence_stdout() -> None:
    """Point stdout and stderr at /dev/null, so that the interpreter's final flush of what is still buffered for a
    reader that left does not print 'Exception ignored ... BrokenPipeError'."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE", "build_parser", "check_text_arguments", "main",
           "message"]
