"""``uaii chat``: an interactive conversation with the model's chat template and history.

Commands at the prompt: ``/reset`` forgets the conversation, ``/exit`` (or Ctrl-D) leaves, ``/help`` lists them.
Ctrl-C while the model answers stops that answer and keeps what was written of it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from . import report
from .context import CliError, Context, add_model_argument, add_runtime_options, check_text, model_path, runtime_options
from .generate import PrefillProgress, add_sampling_options, chat_prompt, sampling_params

HELP = "/reset forgets the conversation · /exit or Ctrl-D leaves · /stats shows the last answer's stats · /help"


def add_parsers(sub: Any) -> None:
    ap = sub.add_parser("chat", help="interactive chat with the model's template and history",
                        description="Interactive chat. " + HELP)
    add_model_argument(ap)
    ap.add_argument("--system", metavar="TEXT", default=None, help="system message at the start of the conversation")
    ap.add_argument("-n", "--max-tokens", type=int, default=512, metavar="N", help="tokens per answer at most (512)")
    ap.add_argument("--stats", action="store_true", help="print the stats line after every answer")
    add_sampling_options(ap)
    add_runtime_options(ap)
    ap.set_defaults(func=cmd_chat)


class ChatLoop:
    """The conversation state: messages so far, and the session that answers."""

    def __init__(self, session: Any, ctx: Context, *, system: str | None, gen: dict[str, Any],
                 show_stats: bool, preset: Any = None) -> None:
        self.session = session
        self.ctx = ctx
        self.system = system
        self.gen = gen
        self.show_stats = show_stats
        self.preset = preset
        self.messages: list[dict[str, str]] = []
        self.last: Any = None
        self.progress = PrefillProgress(ctx)
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        if hasattr(self.session, "reset"):
            self.session.reset()  # empty the KV cache too (a continued conversation reuses it)

    def command(self, line: str) -> bool:
        """Handle a /command; False means leave."""
        name = line.split()[0].lower()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/reset":
            self.reset()
            self.ctx.note("(conversation reset)")
        elif name == "/stats":
            self.ctx.note(report.stats_line(self.last.stats, self.preset) if self.last else "(no answer yet)")
        else:
            self.ctx.note(HELP)
        return True

    def answer(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        prompt = chat_prompt(self.session, self.messages)
        bounds = getattr(self.session, "bounds", None)  # a Session's ContextBounds; without them, not checked here
        if bounds is not None and not bounds.fits(len(prompt)):
            self.messages.pop()  # the Session would refuse it: say so and keep the conversation
            self.ctx.note(f"(the conversation is {len(prompt)} tokens, more than the model's context of "
                          f"{bounds.context}: /reset starts over)")
            return
        pieces: list[str] = []
        try:
            for piece in self.session.stream(prompt, add_special=False, on_prefill=self.progress, **self.gen):
                pieces.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            self.progress.close()
            self.ctx.note("\n(interrupted)")
        finally:
            self.progress.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
        result = getattr(self.session, "last_result", None)
        reply = result.text if result is not None and result.text else "".join(pieces)
        self.messages.append({"role": "assistant", "content": reply.strip()})
        self.last = result
        if self.show_stats and result is not None:
            self.ctx.note(report.stats_line(result.stats, self.preset, result.finish_reason))


def read_line(prompt: str) -> str | None:
    """One line from the user; None at end of input. The prompt goes to stderr so stdout holds only answers.

    Lines are UTF-8 whatever the locale says; a line that is not raises CliError (the loop says so and goes on).
    """
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        try:
            return check_text(input(prompt), "the line")
        except EOFError:
            return None
        except UnicodeDecodeError as exc:  # a terminal in a strict UTF-8 locale
            raise CliError(f"the line is not valid UTF-8: byte {exc.object[exc.start]:#04x} at offset "
                           f"{exc.start}") from None
    sys.stderr.write(prompt)
    sys.stderr.flush()
    raw = getattr(sys.stdin, "buffer", sys.stdin).readline()
    line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    return None if line == "" else check_text(line.rstrip("\n"), "the line")


def cmd_chat(args: argparse.Namespace, ctx: Context) -> int:
    path = model_path(args.model)
    if args.max_tokens < 1:
        raise CliError(f"-n must be >= 1, found {args.max_tokens}")
    params = sampling_params(args, ctx)
    preset, options = runtime_options(args)
    if sys.stdin is None or sys.stdin.closed:
        raise CliError("stdin is closed; uaii chat reads your messages from stdin")
    session = ctx.open_session(path, **options)
    try:
        loop = ChatLoop(session, ctx, system=args.system, show_stats=args.stats, preset=preset,
                        gen={"max_new_tokens": args.max_tokens, "sampling": params})
        ctx.note(f"chatting with {path.name} · preset {preset.describe()} · {HELP}")
        while True:
            try:
                line = read_line("> ")
            except CliError as exc:  # not UTF-8: said and not sent; the conversation goes on unchanged
                ctx.note(f"error: {exc}; the line was not sent")
                continue
            if line is None:
                sys.stderr.write("\n")
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not loop.command(line):
                    break
                continue
            loop.answer(line)
        return 0
    finally:
        session.close()


__all__ = ["ChatLoop", "add_parsers", "cmd_chat"]
