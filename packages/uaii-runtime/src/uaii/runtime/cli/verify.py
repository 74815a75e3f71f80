"""``uaii verify MODEL [--sha256 HEX]``: hash a model's files and check its structure.

GGUF has no checksums: a flipped bit in tensor data loads and generates subtly wrong text, and only a hash of
the whole file compared with the publisher's can tell. This command streams every file of the model (each shard
of a split GGUF) through sha256, prints digest and size, runs the reader's structural checks (the tensor table
against the data, the metadata's counts against the tensors) and compares each digest with ``--sha256`` or,
for the models UAII is tested with, the digest below. Exit code 1 on any mismatch or failed check.

Hashing is meant to be cheap: 8 MiB reads into one reused buffer (hashlib releases the GIL for them), and
``posix_fadvise(DONTNEED)`` behind the reads so that verifying a 10 GB model does not push everything else out
of the page cache.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from . import report
from .context import CliError, Context, model_path

CHUNK_BYTES = 8 << 20

# File name -> (model, size, sha256) of the models UAII is tested with (the same pins as scripts/models.py).
KNOWN_MODELS: dict[str, tuple[str, int, str]] = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": (
        "SmolLM2-135M-Instruct Q4_1", 98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma-3-270m-Q4_K_M.gguf": (
        "Gemma-3-270M Q4_K_M", 253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}
_HEX = re.compile(r"^[0-9a-f]{64}$")


def add_parsers(sub: Any) -> None:
    v = sub.add_parser("verify", help="sha256 of the model's files, checked against --sha256 or the known "
                                      "models, plus the GGUF structure checks")
    v.add_argument("model", metavar="MODEL", help="a GGUF file (any shard of a split model) or any other file")
    v.add_argument("--sha256", action="append", default=[], metavar="HEX",
                   help="expected digest (64 hex digits); once per file, in shard order, for a split model")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=cmd_verify)


@dataclass
class FileDigest:
    path: Path
    size: int
    sha256: str
    expected: str | None = None  # what the digest should be, when known
    source: str = ""  # where ``expected`` comes from: --sha256 or the known model's name

    @property
    def match(self) -> bool | None:
        return None if self.expected is None else self.sha256 == self.expected

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size": self.size, "sha256": self.sha256, "expected": self.expected,
                "expected_from": self.source or None, "match": self.match}


def sha256_file(path: Path, advance: Callable[[int], None] = lambda n: None) -> str:
    """sha256 of ``path``, read in CHUNK_BYTES pieces into one buffer; the pages read are dropped behind us."""
    h = hashlib.sha256()
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    fadvise = getattr(os, "posix_fadvise", None)
    with open(path, "rb", buffering=0) as f:
        fd, pos = f.fileno(), 0
        if fadvise is not None:
            fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := f.readinto(buf):
            h.update(view[:n])
            if fadvise is not None:
                fadvise(fd, pos, n, os.POSIX_FADV_DONTNEED)
            pos += n
            advance(n)
    return h.hexdigest()


@dataclass
class Structure:
    """What the structure checks found: ``checked`` is False for a file that is not a GGUF (only hashed)."""

    checked: bool
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if not self.checked:
            return "not a GGUF file: only hashed"
        return self.problem or "ok: the tensor table tiles the data and the metadata's counts match the tensors"


def model_files(path: Path) -> tuple[list[Path], Structure]:
    """The files to hash and what the structure checks found: every shard of a GGUF that opens, else the file
    itself (a damaged header still gets its digest, which is what to compare with the publisher's)."""
    from uaii.ir import UaiiError
    from uaii.loaders.gguf import is_gguf, open_gguf
    from uaii.loaders.gguf_counts import check_counts

    if not is_gguf(path):
        return [path], Structure(checked=False)
    try:
        g = open_gguf(path)
        check_counts(g.metadata, g.tensors, g.path.name)
    except UaiiError as exc:
        return [path], Structure(checked=True, problem=str(exc))
    return list(g.shards), Structure(checked=True)


def expected_digests(files: list[Path], given: list[str]) -> list[tuple[str | None, str]]:
    """(expected digest, where it comes from) per file: --sha256 in order, else the known model of that name."""
    given = [h.strip().lower() for h in given]
    bad = [h for h in given if not _HEX.match(h)]
    if bad:
        raise CliError(f"--sha256 expects 64 hex digits, found {bad[0]!r}")
    if given and len(given) != len(files):
        raise CliError(f"{len(given)} --sha256 values for {len(files)} files ({', '.join(f.name for f in files)}); "
                       "give one per file, in shard order")
    if given:
        return [(h, "--sha256") for h in given]
    out: list[tuple[str | None, str]] = []
    for f in files:
        known = KNOWN_MODELS.get(f.name)
        out.append((known[2], known[0]) if known else (None, ""))
    return out


def hash_files(files: list[Path], ctx: Context) -> list[FileDigest]:
    """Digest every file with a progress bar on stderr, then one line with the throughput."""
    sizes = [f.stat().st_size for f in files]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=ctx.err, disable=not ctx.animate, transient=True)
    t0 = time.perf_counter()
    digests = []
    with progress:
        for f, size in zip(files, sizes, strict=True):
            task = progress.add_task(f"sha256 {f.name}", total=size)
            digest = sha256_file(f, functools.partial(progress.advance, task))
            digests.append(FileDigest(f, size, digest))
    seconds = time.perf_counter() - t0
    total = sum(sizes)
    ctx.note(f"hashed {report.size(total) if total else '0 B'} in {report.seconds(seconds)} "
             f"({report.size(total / max(seconds, 1e-9))}/s)")
    return digests


def cmd_verify(args: argparse.Namespace, ctx: Context) -> int:
    path = model_path(args.model)
    if not path.is_file():
        raise CliError(f"{args.model}: expected a model file (a GGUF file or one shard of a split GGUF)")
    files, structure = model_files(path)
    expected = expected_digests(files, args.sha256)
    digests = hash_files(files, ctx)
    for d, (want, source) in zip(digests, expected, strict=True):
        d.expected, d.source = want, source
    if args.json:
        report.print_json({"files": [d.to_dict() for d in digests], "structure": {
            "checked": structure.checked, "ok": structure.ok, "detail": structure.describe()}})
    else:
        for d in digests:
            verdict = {None: "no reference digest", True: f"matches {d.source}", False: f"MISMATCH ({d.source})"}
            _line(ctx, f"{d.sha256}  {d.size} bytes  {d.path.name}  {verdict[d.match]}")
        _line(ctx, f"structure: {structure.describe()}")
    bad = [d for d in digests if d.match is False]
    if bad:
        raise CliError(f"[verify] {bad[0].path.name}: sha256 {bad[0].sha256} does not match {bad[0].expected} "
                       f"({bad[0].source})" + (f" (and {len(bad) - 1} more files)" if len(bad) > 1 else ""))
    if not structure.ok:
        raise CliError(str(structure.problem))  # the reader's own message: file, tensor, byte offset
    return 0


def _line(ctx: Context, text: str) -> None:
    """One plain line on stdout: a message in brackets ([gguf] ...) is not rich markup."""
    ctx.out.print(text, highlight=False, markup=False, soft_wrap=True)


__all__ = ["KNOWN_MODELS", "add_parsers", "cmd_verify", "model_files", "sha256_file"]
