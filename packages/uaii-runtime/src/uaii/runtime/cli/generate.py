"""``uaii run``: generate from a prompt, streaming text to stdout, then a stats line on stderr (or one JSON object)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from uaii.runtime.sampling import SamplingParams

from . import report
from .context import CliError, Context, add_model_argument, add_runtime_options, model_path, read_stdin, runtime_options


def add_parsers(sub: Any) -> None:
    ap = sub.add_parser("run", help="generate text from a prompt (streams; greedy unless --temp is given)",
                        description="Generate text from a prompt. Text streams to stdout as it is generated; a "
                                    "stats line follows on stderr. Greedy decoding (--temp 0) unless --temp is given.")
    add_model_argument(ap)
    ap.add_argument("-p", "--prompt", required=True, metavar="TEXT",
                    help="the prompt, used as given unless --chat ('-' reads stdin)")
    ap.add_argument("-n", "--max-tokens", type=int, default=128, metavar="N", help="tokens to generate (128)")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    ap.add_argument("--system", metavar="TEXT", default=None, help="system message (with --chat)")
    ap.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_sampling_options(ap)
    add_runtime_options(ap)
    ap.set_defaults(func=cmd_run)


def add_sampling_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("sampling (greedy unless --temp > 0)")
    g.add_argument("--temp", "--temperature", dest="temp", type=float, default=None, metavar="T",
                   help="temperature; 0 = greedy (the default)")
    g.add_argument("--top-k", type=int, default=None, metavar="K", help="keep the K most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling mass in (0, 1]")
    g.add_argument("--min-p", type=float, default=None, metavar="P", help="drop tokens below P x the top one")
    g.add_argument("--repeat-penalty", type=float, default=None, metavar="R",
                   help="repetition penalty (1 = off; HF style, over prompt and output)")
    g.add_argument("--seed", type=int, default=None, metavar="S", help="random seed: same seed, same tokens")


def sampling_params(args: argparse.Namespace, ctx: Context | None = None) -> SamplingParams:
    """SamplingParams from the options; greedy unless --temp > 0 (filters alone do not switch sampling on)."""
    given = {name: getattr(args, name) for name in ("top_k", "top_p", "min_p", "seed")
             if getattr(args, name) is not None}
    params = SamplingParams(temperature=0.0 if args.temp is None else args.temp, top_k=args.top_k or 0,
                            top_p=1.0 if args.top_p is None else args.top_p, min_p=args.min_p or 0.0,
                            repetition_penalty=1.0 if args.repeat_penalty is None else args.repeat_penalty,
                            seed=args.seed)
    if params.greedy and given and ctx is not None:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        ctx.note(f"note: {flags} has no effect with greedy decoding; add --temp (e.g. --temp 0.8) to sample")
    return params


def read_prompt(text: str) -> str:
    """The prompt of ``-p``; ``-`` reads stdin as UTF-8 (argv was checked by ``main``)."""
    return read_stdin("the prompt") if text == "-" else text


def chat_prompt(session: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the model's chat template, ready to generate the reply."""
    tok = getattr(session, "tokenizer", None)
    if tok is not None and hasattr(tok, "encode_chat"):
        return list(tok.encode_chat(list(messages), add_generation_prompt=True))
    raise CliError("this Session exposes no tokenizer with a chat template (session.tokenizer.encode_chat)")


def stream_to(out: Any, pieces: Any, shown: list[str] | None = None) -> None:
    """Write text pieces as they come, flushing each (the answer appears while it is generated); ``shown``
    collects them, so that a caller knows what reached the reader when the stream fails."""
    for piece in pieces:
        if piece:
            out.write(piece)
            out.flush()
            if shown is not None:
                shown.append(piece)


class PrefillProgress:
    """``on_prefill`` of a generation: a prompt that takes more than one prefill pass shows its progress on stderr,
    as a bar when stderr is a terminal (removed when the prefill ends), else as one note when it is longer than
    NOTE_TOKENS, so that a prefill of minutes never looks like a hang. ``close()`` removes a bar left by an
    interrupted prefill."""

    NOTE_TOKENS = 4096  # eight prefill passes of the default max_batch

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if done == 0:
            self._start(total)
        elif self._bar is not None:
            self._bar.update(self._task, completed=done)
        if done >= total:
            self.close()

    def _start(self, total: int) -> None:
        self.close()
        if self.ctx.animate:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("prefill"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 console=self.ctx.err, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("prefill", total=total)
        elif total > self.NOTE_TOKENS:
            self.ctx.note(f"(prefill of {total} prompt tokens ...)")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def cmd_run(args: argparse.Namespace, ctx: Context) -> int:
    path = model_path(args.model)
    if args.max_tokens < 0:
        raise CliError(f"-n must be >= 0, found {args.max_tokens}")
    if args.system is not None and not args.chat:
        raise CliError("--system needs --chat (the system message goes through the chat template)")
    params = sampling_params(args, ctx)
    preset, options = runtime_options(args)
    text = read_prompt(args.prompt)
    progress = PrefillProgress(ctx)
    kwargs: dict[str, Any] = {"max_new_tokens": args.max_tokens, "sampling": params, "stop": tuple(args.stop),
                              "on_prefill": progress}
    session = ctx.open_session(path, **options)
    try:
        prompt: str | list[int] = text
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
                       [{"role": "user", "content": text}]
            prompt = chat_prompt(session, messages)
            kwargs["add_special"] = False  # the template wrote BOS and the turn markers
        if args.json:
            result = session.generate(prompt, **kwargs)
            report.print_json(report.result_json(result, preset, sampling=params.to_dict()))
            return 0
        shown: list[str] = []
        try:
            stream_to(sys.stdout, session.stream(prompt, **kwargs), shown)
        except BaseException:
            if shown:  # end the partial answer's line; an error before any text leaves stdout empty
                sys.stdout.write("\n")
                sys.stdout.flush()
            raise
        sys.stdout.write("\n")
        sys.stdout.flush()
        result = session.last_result
        ctx.note(report.stats_line(result.stats, preset, result.finish_reason))
        return 0
    finally:
        progress.close()
        session.close()


__all__ = ["PrefillProgress", "add_parsers", "add_sampling_options", "chat_prompt", "cmd_run", "sampling_params",
           "stream_to"]
