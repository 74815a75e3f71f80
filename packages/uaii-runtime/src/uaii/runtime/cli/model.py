"""``uaii tokenize | detokenize | convert`` (``inspect`` lives in :mod:`.inspection`).

Tokenizing reads only the tokenizer (``uaii.tokenizers.load``); converting reads the model's header and tensor
table and writes its IR graph (weights stay where they are; the graph references them by path).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import inspection, report
from .context import CliError, Context, add_model_argument, model_path, read_stdin


def add_parsers(sub: Any) -> None:
    t = sub.add_parser("tokenize", help="token ids (and pieces) of a text")
    add_model_argument(t)
    t.add_argument("text", metavar="TEXT", help="text to tokenize ('-' reads stdin)")
    t.add_argument("--no-special", action="store_true", help="do not add BOS/EOS")
    t.add_argument("--parse-special", action="store_true", help="turn special-token text (<|im_start|>) into ids")
    t.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    t.set_defaults(func=cmd_tokenize)

    d = sub.add_parser("detokenize", help="text of token ids")
    add_model_argument(d)
    d.add_argument("ids", nargs="+", metavar="IDS", help='ids as "1,2,3" or "1 2 3"')
    d.add_argument("--keep-special", action="store_true", help="keep control tokens in the text")
    d.add_argument("--json", action="store_true", help='print {"text": ...}')
    d.set_defaults(func=cmd_detokenize)

    inspection.add_parsers(sub)

    c = sub.add_parser("convert", help="write the model's IR graph to OUT.uaii (binary) or OUT.uaii.json")
    add_model_argument(c)
    c.add_argument("output", metavar="OUT", nargs="?", help="OUT.uaii or OUT.uaii.json (atomic write)")
    c.add_argument("-o", "--output", dest="output_opt", metavar="OUT", help="the same as the positional OUT")
    c.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.set_defaults(func=cmd_convert)


def _tokenizer(raw: str) -> Any:
    from uaii.tokenizers import load

    return load(model_path(raw))


def parse_ids(parts: list[str]) -> list[int]:
    """``["1,2,3"]``, ``["1", "2", "3"]``, ``["[1, 2, 3]"]`` → ``[1, 2, 3]``."""
    tokens = [t for t in re.split(r"[\s,\[\]]+", " ".join(parts)) if t]
    if not tokens:
        raise CliError("no token ids given")
    ids = []
    for t in tokens:
        try:
            value = int(t)
        except ValueError:
            raise CliError(f"token id {t!r} is not an integer") from None
        if value < 0:
            raise CliError(f"token id {value} is negative")
        ids.append(value)
    return ids


def cmd_tokenize(args: argparse.Namespace, ctx: Context) -> int:
    text = read_stdin("the text") if args.text == "-" else args.text  # argv was checked by main
    tok = _tokenizer(args.model)
    ids = tok.encode(text, add_special=not args.no_special, parse_special=args.parse_special)
    pieces = [tok.id_to_piece(i) for i in ids]
    if args.json:
        report.print_json({"ids": ids, "pieces": pieces, "count": len(ids)})
        return 0
    ctx.out.print(" ".join(map(str, ids)), highlight=False, soft_wrap=True)
    table = Table(title=f"{len(ids)} tokens", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("id", justify="right")
    table.add_column("piece")
    for n, (i, piece) in enumerate(zip(ids, pieces, strict=True)):
        table.add_row(str(n), str(i), repr(piece) + (" (special)" if tok.is_special(i) else ""))
    ctx.out.print(table)
    return 0


def cmd_detokenize(args: argparse.Namespace, ctx: Context) -> int:
    tok = _tokenizer(args.model)
    ids = parse_ids(args.ids)
    vocab = tok.vocab_size
    bad = [i for i in ids if i >= vocab]
    if bad:
        raise CliError(f"token id {bad[0]} is out of range; the vocabulary has {vocab} ids")
    text = tok.decode(ids, skip_special=not args.keep_special)
    if args.json:
        report.print_json({"text": text, "ids": ids})
    else:
        sys.stdout.write(text + "\n")
    return 0


def cmd_convert(args: argparse.Namespace, ctx: Context) -> int:
    from uaii.ir import save
    from uaii.ir.serialize import file_format
    from uaii.loaders import load_model

    path = model_path(args.model)
    if (args.output is None) == (args.output_opt is None):
        raise CliError("name the output once: uaii convert MODEL OUT, or uaii convert MODEL -o OUT")
    out = Path(args.output or args.output_opt).expanduser()
    file_format(out)  # an unknown extension fails before any work
    if out.exists() and not args.force:
        raise CliError(f"{out} exists; pass --force to replace it")
    if not out.parent.exists():
        raise CliError(f"{out.parent}: no such directory")
    progress = Progress(TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=ctx.err, disable=not ctx.animate, transient=True)
    with progress:
        task = progress.add_task(f"reading {path.name}", total=3)
        model = load_model(path)  # reads header + tensor table, builds and validates the graph
        progress.update(task, advance=1, description="building IR graph")
        graph = model.graph
        progress.update(task, advance=1, description=f"writing {out.name}")
        save(graph, out)  # temp file, fsync, rename: a failure never leaves a partial OUT
        progress.update(task, advance=1, description="done")
    size = os.path.getsize(out)
    ctx.out.print(f"wrote {out} ({report.size(size)}): graph '{graph.name}', {len(graph.nodes)} nodes, "
                  f"{len(graph.weights)} weights referenced in {model.base_dir} (not copied)",
                  highlight=False, soft_wrap=True)
    return 0


__all__ = ["add_parsers", "cmd_convert", "cmd_detokenize", "cmd_tokenize", "parse_ids"]
