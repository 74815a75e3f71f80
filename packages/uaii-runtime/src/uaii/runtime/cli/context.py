"""What every subcommand shares: the consoles (rich, plain when not a terminal), the Session factory, the model
path check, and the options that map to Session options (threads, preset, budget)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from uaii.ir import UaiiError
from uaii.runtime import presets

SessionFactory = Callable[..., Any]


class CliError(UaiiError):
    """Bad command-line input: a missing file, an unreadable option value."""

    component = "cli"


def default_session_factory(path: str, **options: Any) -> Any:
    from uaii.runtime import Session  # imported when a command needs it: `uaii --help` stays fast

    return Session(path, **options)


@dataclass
class Context:
    out: Console  # tables and reports on stdout
    err: Console  # progress, stats lines and notes on stderr
    session_factory: SessionFactory
    plain: bool  # no colors or animations

    @classmethod
    def create(cls, *, no_color: bool = False, session_factory: SessionFactory | None = None) -> Context:
        plain = no_color or bool(os.environ.get("NO_COLOR"))
        out = _console(sys.stdout, plain)
        err = _console(sys.stderr, plain)
        return cls(out, err, session_factory or default_session_factory, plain or not err.is_terminal)

    def close(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):  # None: closed when we started
                stream.flush()

    @property
    def animate(self) -> bool:
        """Whether spinners and progress bars are drawn (stderr is a terminal and colors are allowed)."""
        return not self.plain

    @contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A spinner on stderr while a long step runs (nothing when not a terminal)."""
        if not self.animate:
            yield
            return
        with self.err.status(text, spinner="dots"):
            yield

    def open_session(self, path: Path, **options: Any) -> Any:
        with self.status(f"loading {path.name} ..."):
            return self.session_factory(str(path), **options)

    def note(self, text: str) -> None:
        """A line for the user on stderr (dim when colored)."""
        self.err.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)


class _Console(Console):
    """rich's Console, except that a reader leaving the pipe is the BrokenPipeError that ``main`` turns into the
    pipe's exit code like any other write (rich's own reaction is ``SystemExit(1)``, a failure code)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _console(stream: Any, plain: bool) -> Console:
    tty = bool(getattr(stream, "isatty", lambda: False)())
    width = None if tty else int(os.environ.get("COLUMNS", "0") or 0) or 120
    return _Console(file=stream, no_color=plain, highlight=False, width=width, soft_wrap=False,
                    force_terminal=False if plain else None, emoji=False)


# ----------------------------------------------------------------------------------------------- text input
def check_text(text: str, what: str) -> str:
    """``text`` when it is valid UTF-8; else a one-line error naming ``what`` and the first bad byte.

    argv and stdin reach Python as str with invalid bytes escaped to lone surrogates; the tokenizer refuses those
    too (uaii.tokenizers.text), but saying so here names the argument and happens before the model loads.
    """
    from uaii.tokenizers.text import utf8_problem  # the one rule, kept with the tokenizers

    problem = utf8_problem(text)
    if problem is not None:
        raise CliError(f"{what} is not valid UTF-8: {problem}")
    return text


def read_stdin(what: str) -> str:
    """All of stdin, decoded as UTF-8 (the encoding models are trained on, whatever the locale says); a closed
    stdin or invalid bytes are one-line errors."""
    stream = sys.stdin
    if stream is None or stream.closed:
        raise CliError(f"stdin is closed; {what} is read from stdin ('-')")
    try:
        raw = stream.buffer.read() if hasattr(stream, "buffer") else stream.read()
    except OSError as exc:
        raise CliError(f"cannot read {what} from stdin: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    return check_text(text, f"{what} (stdin)")


# --------------------------------------------------------------------------------------------- shared options
def model_path(raw: str) -> Path:
    """The model argument as a path that exists (a file or a directory), else a one-line error."""
    p = Path(raw).expanduser()
    if not p.exists():
        raise CliError(f"{raw}: no such file or directory (expected a GGUF file or a Hugging Face model directory)")
    return p


def add_model_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("model", metavar="MODEL", help="a GGUF file, a Hugging Face model directory or an ONNX file")


def add_runtime_options(ap: argparse.ArgumentParser) -> None:
    """--threads, --preset, --budget, the KV cache flags, --gemm and the device flags (--device,
    --allow-software-adapter, --gpu-budget): the Session options of run, chat and bench."""
    g = ap.add_argument_group("runtime")
    g.add_argument("--device", default=None, metavar="NAME",
                   help="backend to run on: cpu (default), webgpu, auto (the first GPU backend with a hardware "
                        "device, else cpu, said on stderr) or a plugin's name; `uaii devices` lists them")
    g.add_argument("--allow-software-adapter", action="store_true",
                   help="let --device webgpu run on a software adapter (lavapipe, SwiftShader: correct and slow, for "
                        "tests); sets UAII_ALLOW_SOFTWARE_GPU=1. --device auto never picks one")
    g.add_argument("--gpu-budget", metavar="BYTES", default=None,
                   help="device memory for weights, activations and KV cache of a GPU backend, e.g. 4GiB; the weights "
                        "that do not fit stream from the host before each use (default: 80%% of the memory the "
                        "device reports)")
    g.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: the runtime's choice)")
    g.add_argument("--preset", choices=presets.PRESET_NAMES, default=None,
                   help=f"memory preset (default: {presets.DEFAULT_PRESET}, {presets.AUTO_FRACTION * 100:.0f}%% of "
                        "MemAvailable); see docs/cli.md")
    g.add_argument("--budget", metavar="BYTES", default=None,
                   help="memory budget, e.g. 256MiB, 2GB (0 = unlimited); replaces the preset's budget")
    g.add_argument("--kv-window", type=int, default=None, metavar="N",
                   help="KV cache window in tokens (0 = keep every token); replaces the preset's window")
    g.add_argument("--kv-sinks", type=int, default=None, metavar="N",
                   help="attention-sink tokens kept outside the window (default 4)")
    g.add_argument("--kv-positions", choices=("absolute", "cache"), default=None,
                   help="rotary positions of a windowed cache: absolute (default) or cache slots (StreamingLLM)")
    g.add_argument("--kv-dtype", choices=("f32", "f16"), default=None,
                   help="KV cache element type (default: the preset's, f16; f32 is exact and twice the bytes)")
    # uaii.backends.config.GEMM_MODES, spelled out: importing uaii.backends here would load the native kernels to
    # build the parser of every command (`uaii --help` and `uaii presets` then fail where the kernels cannot load)
    g.add_argument("--gemm", choices=("fast", "f32"), default=None,
                   help="matrix products of quantized weights on the cpu and cuda devices: fast (8-bit activations, "
                        "as llama.cpp; on the cpu 16-bit for the output projection where the weight type has that "
                        "kernel) or f32 (exact, slower); default: fast ($UAII_CPU_GEMM on the cpu)")
    add_pipeline_options(ap)


def add_pipeline_options(ap: argparse.ArgumentParser) -> None:
    """--pipeline and its companions: the decoder's layers as stages on several nodes (Ray actors)."""
    g = ap.add_argument_group("pipeline stages (Ray; pip install 'uaii-runtime[ray]')")
    g.add_argument("--pipeline", type=int, default=None, metavar="K",
                   help="run the decoder's layers as K stages, one Ray actor per node, each holding only its layers "
                        "under its own budget (--budget-per-node, else the preset resolved on each node); per token "
                        "only the hidden state crosses between nodes")
    g.add_argument("--budget-per-node", metavar="BYTES", default=None,
                   help="each stage's memory budget, e.g. 1.2GiB (with --pipeline; replaces --budget)")
    g.add_argument("--pipeline-starts", metavar="L1,L2,...", default=None,
                   help="the layers where stages 2..K begin (default: chosen from the budgets)")
    g.add_argument("--ray-address", "--address", dest="ray_address", metavar="ADDR", default=None,
                   help="the Ray cluster to join, for --pipeline (and uaii serve --ray), e.g. 10.0.0.5:6379 or auto "
                        "(default: --pipeline joins the one Ray finds, as `ray.init()` does; serve --ray starts a "
                        "local one)")
    g.add_argument("--pipeline-local", action="store_true",
                   help="every stage in this process instead of on Ray nodes (checks a split on one machine)")
    g.add_argument("--stage-timeout", type=float, default=None, metavar="S",
                   help="seconds a stage may take to answer before it counts as lost (default 120)")


def pipeline_starts(text: str) -> tuple[int, ...]:
    """The layers of ``--pipeline-starts L1,L2,...``."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CliError(f"--pipeline-starts takes layer numbers separated by commas, found {text!r}") from None


def pipeline_options(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the pipeline flags applied. With --pipeline and no --budget-per-node the budget is left
    to each stage's node (its preset resolved there); --budget, this machine's, is refused as ambiguous."""
    k = getattr(args, "pipeline", None)
    replicas = bool(getattr(args, "ray", False))  # uaii serve --ray joins the cluster at --ray-address too
    given = [flag for flag, name in (("--budget-per-node", "budget_per_node"), ("--pipeline-starts",
             "pipeline_starts"), ("--ray-address", "ray_address"), ("--pipeline-local", "pipeline_local"),
             ("--stage-timeout", "stage_timeout")) if getattr(args, name, None) not in (None, False)
             and not (replicas and name == "ray_address")]
    if k is None:
        if given:
            also = " (--ray-address also with uaii serve --ray)" if hasattr(args, "ray") else ""
            raise CliError(f"{', '.join(given)} apply only with --pipeline K{also}")
        return options
    if k < 2:
        raise CliError(f"--pipeline must be >= 2 (stages), found {k}")
    if getattr(args, "budget", None) is not None:
        raise CliError("--budget is this machine's budget; with --pipeline give each stage's: --budget-per-node")
    out = {**options, "pipeline": k}
    if args.budget_per_node is not None:
        out["budget_bytes"] = presets.parse_bytes(args.budget_per_node)
    else:
        out.pop("budget_bytes", None)  # each stage resolves the preset on its own node
    if args.pipeline_starts is not None:
        out["pipeline_starts"] = pipeline_starts(args.pipeline_starts)
    if args.ray_address is not None:
        out["ray_address"] = args.ray_address
    if args.pipeline_local:
        out["pipeline_transport"] = "local"
    if args.stage_timeout is not None:
        out["stage_timeout_s"] = args.stage_timeout
    return out


def runtime_options(args: argparse.Namespace) -> tuple[presets.Preset, dict[str, Any]]:
    """The preset the command runs with and the Session options it sets."""
    preset = presets.resolve(args.preset, args.budget)
    options = preset.session_options()
    if args.threads is not None:
        if args.threads < 1:
            raise CliError(f"--threads must be >= 1, found {args.threads}")
        options["n_threads"] = args.threads
    for flag, name, lo in (("--kv-window", "kv_window", 0), ("--kv-sinks", "kv_sinks", 0)):
        value = getattr(args, name, None)
        if value is not None:
            if value < lo:
                raise CliError(f"{flag} must be >= {lo}, found {value}")
            options[name] = value
            preset = replace(preset, **{name: value})  # the stats line shows the window in effect
    if getattr(args, "kv_positions", None) is not None:
        options["kv_positions"] = args.kv_positions
    if getattr(args, "kv_dtype", None) is not None:
        options["kv_dtype"] = args.kv_dtype
        preset = replace(preset, kv_dtype=args.kv_dtype)  # the stats line shows the cache in effect
    if getattr(args, "gemm", None) is not None:
        options["gemm"] = args.gemm
    options.update(device_options(args))
    return preset, pipeline_options(args, options)


def device_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Session options of --device and --gpu-budget. --allow-software-adapter is the process's opt-in
    (:func:`uaii.backends.registry.allow_software_devices`: the GPU backends read it when they choose their adapter;
    the registry's backends are shared by every session of the process, so the opt-in is the process's)."""
    options: dict[str, Any] = {}
    if getattr(args, "device", None) is not None:
        if not args.device.strip():
            raise CliError("--device needs a backend name (cpu, webgpu, auto, ...; see uaii devices)")
        options["device"] = args.device.strip()
    if getattr(args, "gpu_budget", None) is not None:
        options["gpu_budget_bytes"] = presets.parse_bytes(args.gpu_budget)
    if getattr(args, "allow_software_adapter", False):
        from uaii.backends.registry import allow_software_devices

        allow_software_devices()
    return options


__all__ = ["CliError", "Context", "SessionFactory", "add_model_argument", "add_pipeline_options",
           "add_runtime_options", "check_text", "default_session_factory", "device_options", "model_path",
           "pipeline_options", "pipeline_starts", "read_stdin", "runtime_options"]
