"""The ``uaii`` command line: run, chat, tokenize, detokenize, inspect, convert, bench, devices, cache, plan, presets.

``main(argv)`` returns the exit code (the console script calls it). One module per group of commands; every
command is documented with an example in docs/cli.md.
"""

from uaii.runtime.cli.app import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, build_parser, main
from uaii.runtime.cli.context import CliError

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "CliError", "build_parser", "main"]
