"""The errors a user meets first, on a tiny runnable GGUF built here: invalid UTF-8 in text, closed or broken
standard streams, Ctrl-C during start-up, unreadable model paths, validation failures, too many threads."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import save
from uaii.ir.validator import Diagnostic, ValidationError
from uaii.runtime import Session
from uaii.runtime.cli import main
from uaii.tokenizers import TokenizerError
from uaii.tokenizers.pieces import byte_decoder

EXE = Path(sys.executable).parent / "uaii"
UAII_CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "uaii.runtime.cli"]  # installed script, or module
CORES = len(os.sched_getaffinity(0))


def tiny_gguf(path: Path) -> Path:
    """A one-layer llama with random weights, a byte-level BPE vocabulary and a chat template (numpy only)."""
    rng = np.random.default_rng(0)
    alphabet = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    tokens = ["<s>", "</s>", *alphabet, "he", "ll", "llo", "hello"]
    v, d, f = len(tokens), 32, 64

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    t = {"token_embd.weight": w(v, d), "output_norm.weight": np.ones(d, np.float32),
         "blk.0.attn_norm.weight": np.ones(d, np.float32), "blk.0.ffn_norm.weight": np.ones(d, np.float32),
         "blk.0.attn_q.weight": w(d, d), "blk.0.attn_k.weight": w(d, d),
         "blk.0.attn_v.weight": w(d, d), "blk.0.attn_output.weight": w(d, d), "blk.0.ffn_gate.weight": w(f, d),
         "blk.0.ffn_up.weight": w(f, d), "blk.0.ffn_down.weight": w(d, f)}
    kv = {"llama.block_count": 1, "llama.context_length": 128, "llama.embedding_length": d,
          "llama.feed_forward_length": f, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 4,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
          "llama.rope.dimension_count": d // 4, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["h e", "l l", "ll o", "he llo"],
          "tokenizer.ggml.token_type": ([3, 3] + [1] * (v - 2), gguf.GGUFValueType.ARRAY),
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
          "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}
    return H.write_gguf(path, "llama", kv, t)[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("cli-errors") / "tiny.gguf")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("UAII_DEBUG", raising=False)
    monkeypatch.delenv("UAII_NUM_THREADS", raising=False)


def no_session(path: str, **options: Any) -> Any:
    raise AssertionError("the model must not be loaded for bad input")


def cli(argv: list[Any], capsys: pytest.CaptureFixture[str], factory: Callable[..., Any] | None = None,
        stdin: bytes | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main([str(a) for a in argv], **({"session_factory": factory} if factory else {}))
    out, err = capsys.readouterr()
    return code, out, err


def uaii(args: list[Any], *, close: tuple[int, ...] = (), timeout: float = 120, **kw: Any) -> Any:
    """The installed `uaii` in a child process whose file descriptors in ``close`` are closed before it starts."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("UAII_DEBUG", None)

    def closing() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run([*UAII_CMD, *map(str, args)], capture_output=True, env=env, timeout=timeout,
                          preexec_fn=closing if close else None, **kw)


# --------------------------------------------------------------------------------------------- invalid UTF-8
@pytest.mark.parametrize(("argv", "what"), [
    (["run", "{m}", "-p", "caf\udcff"], "the prompt (-p)"),
    (["run", "{m}", "--chat", "--system", "caf\udcff", "-p", "hi"], "the system message (--system)"),
    (["run", "{m}", "-p", "hi", "--stop", "ok", "--stop", "caf\udcff"], "--stop"),
    (["chat", "{m}", "--system", "caf\udcff"], "the system message (--system)"),
    (["tokenize", "{m}", "caf\udcff"], "the text"),
])
def test_invalid_utf8_in_argv_is_one_line_before_loading(tiny: Path, argv: list[str], what: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([a.format(m=tiny) for a in argv], capsys, no_session)
    assert (code, out) == (1, "")
    assert err == f"error: [cli] {what} is not valid UTF-8: byte 0xff at offset 3\n"


@pytest.mark.parametrize(("argv", "what"), [(["run", "{m}", "-p", "-"], "the prompt (stdin)"),
                                            (["tokenize", "{m}", "-"], "the text (stdin)")])
def test_invalid_utf8_on_stdin_is_one_line(tiny: Path, argv: list[str], what: str,
                                           capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli([a.format(m=tiny) for a in argv], capsys, no_session, b"ok\ncaf\xc3(", monkeypatch)
    assert (code, out) == (1, "")
    assert err == f"error: [cli] {what} is not valid UTF-8: byte 0xc3 at offset 6\n"


def test_stdin_is_read_as_utf8_whatever_the_locale(tiny: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = cli(["tokenize", tiny, "héllo", "--json"], capsys)
    assert code == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("héllo".encode()), encoding="latin-1"))
    code, piped, _ = cli(["tokenize", tiny, "-", "--json"], capsys)
    assert code == 0 and json.loads(piped)["ids"] == json.loads(out)["ids"]  # not 'hÃ©llo'


def test_a_bad_chat_line_is_reported_and_the_chat_goes_on(tiny: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["chat", tiny, "-n", "4", "--kv-dtype", "f32"]
    code, with_bad, err = cli(argv, capsys, stdin=b"hello\ncaf\xff\nhello\n", monkeypatch=monkeypatch)
    assert code == 0
    assert "error: [cli] the line is not valid UTF-8: byte 0xff at offset 3; the line was not sent" in err
    code, clean, _ = cli(argv, capsys, stdin=b"hello\nhello\n", monkeypatch=monkeypatch)
    assert code == 0 and clean.strip() and with_bad == clean  # both answers, as if the bad line had not been typed


def test_the_python_api_refuses_lone_surrogates_and_keeps_working(tiny: Path) -> None:
    with Session(tiny, plan_cache=False) as s:
        with pytest.raises(TokenizerError, match=r"the text is not valid UTF-8: byte 0xff at offset 3"):
            s.tokenize("caf\udcff")
        with pytest.raises(TokenizerError, match=r"lone surrogate U\+D800 at character 1"):
            s.generate("a\ud800", max_new_tokens=2)
        assert len(s.generate("hello", max_new_tokens=2).tokens) == 2


# ------------------------------------------------------------------------------------------ standard streams
def test_closed_stdin(tiny: Path) -> None:
    chat = uaii(["chat", tiny], close=(0,))
    assert chat.returncode == 1 and chat.stdout == b""
    assert chat.stderr == b"error: [cli] stdin is closed; uaii chat reads your messages from stdin\n"
    run = uaii(["run", tiny, "-p", "-"], close=(0,))
    assert run.returncode == 1
    assert run.stderr == b"error: [cli] stdin is closed; the prompt is read from stdin ('-')\n"
    empty = uaii(["chat", tiny], stdin=subprocess.DEVNULL)  # an empty stdin is the end of the conversation
    assert empty.returncode == 0 and b"Traceback" not in empty.stderr


def test_closed_stdout_is_one_line_and_closed_stderr_is_silent(tiny: Path) -> None:
    for args in (["run", tiny, "-p", "hi", "-n", "2"], ["run", tiny, "-p", "hi", "-n", "2", "--json"],
                 ["inspect", tiny], ["--version"]):
        p = uaii(args, close=(1,))
        assert p.returncode == 1, args
        assert p.stderr.decode() == ("error: [cli] stdout is closed (file descriptor 1); uaii writes its results "
                                     "there: redirect it to a file or to /dev/null instead of closing it\n")
    quiet = uaii(["run", tiny, "-p", "hi", "-n", "2", "--json"], close=(2,))
    assert quiet.returncode == 0 and len(json.loads(quiet.stdout)["tokens"]) == 2


@pytest.mark.parametrize("args", [["run", "{m}", "-p", "hi", "-n", "8"], ["run", "{m}", "-p", "hi", "--json"],
                                  ["inspect", "{m}"], ["tokenize", "{m}", "hello"], ["devices"]])
def test_a_reader_that_leaves_ends_with_141_and_nothing_on_stderr(tiny: Path, args: list[str]) -> None:
    p = subprocess.Popen([*UAII_CMD, *(a.format(m=tiny) for a in args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "NO_COLOR": "1"})
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # `| head -c 0`: the reader is gone before the first byte
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141, err
    assert b"Traceback" not in err and b"error" not in err and b"Exception ignored" not in err


def _mapped(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("checkpoint", ["_multiarray_umath", "_uaii_kernels"])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tiny: Path, checkpoint: str) -> None:
    """SIGINT once the process has reached a point of its start-up (numpy being imported; the kernels loaded)."""
    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc to see how far the start-up got")
    p = subprocess.Popen([*UAII_CMD, "run", str(tiny), "-p", "hi", "-n", "64"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"})
    deadline = time.monotonic() + 60
    while not _mapped(p.pid, checkpoint) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()[-2000:]
    assert p.returncode == 130 and err.endswith(b"interrupted\n"), (p.returncode, err)


def test_the_entry_point_imports_nothing_heavy_before_its_handler() -> None:
    """What makes the test above hold on any machine: `from uaii.runtime.cli import main` (the console script's
    line) imports neither numpy nor the commands, so they load inside main's Ctrl-C handler."""
    probe = ("import sys; from uaii.runtime.cli import main; "
             "print(sorted(m for m in ('numpy', 'rich', 'uaii.ir', 'uaii.runtime.cli.app') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr


# ----------------------------------------------------------------------------------------------- model paths
def test_an_ir_file_whose_weight_file_is_missing_names_it(tiny: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from uaii.loaders import load_model

    ir = tmp_path / "moved.uaii"
    save(load_model(tiny).graph, ir)  # references tiny.gguf, which is not beside it
    code, _, err = cli(["run", ir, "-p", "hi"], capsys)
    assert code == 1
    assert err.startswith(f"error: [runtime] {ir}: weight 'token_embd.weight' references "
                          f"'tiny.gguf#token_embd.weight', but {tmp_path / 'tiny.gguf'} does not exist")


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("empty.gguf", b"", "[gguf] {p}: empty file; expected a GGUF header"),
    ("magic.gguf", b"GGML\x03\0\0\0", "[gguf] {p}: not a GGUF file: expected magic b'GGUF', found b'GGML'"),
])
def test_bad_model_files_say_what_was_found(tmp_path: Path, name: str, content: bytes, needle: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    for command in (["run", p, "-p", "x"], ["inspect", p], ["plan", p], ["bench", p]):
        code, _, err = cli(command, capsys)
        assert code == 1 and err.startswith("error: " + needle.format(p=p)), (command, err)


def test_plan_says_why_there_is_no_plan(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file name that is not UTF-8 cannot be a weight reference of a storable plan: the planner fails, and
    `uaii plan` says so instead of claiming uaii-planner is missing."""
    odd = tmp_path / "caf\udcff.gguf"
    shutil.copy(tiny, odd)
    code, out, err = cli(["plan", odd], capsys)
    assert (code, out) == (1, "")
    shown = str(odd).replace("\udcff", "\\udcff")  # printed escaped: writable to any stream
    assert err.splitlines()[-1] == (f"error: [cli] {shown}: no storage plan could be made for this model (the warning "
                                    "above says why); a session runs its graph in its own order, without a plan")
    assert "warning: [runtime] planning" in err and "not installed" not in err


# ------------------------------------------------------------------------------------------------ validation
def test_a_validation_failure_names_the_file_and_lists_the_diagnostics(tiny: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An IR file whose graph declares two wrong weight shapes (the loaders' own checks catch them in a GGUF)."""
    from uaii.loaders import load_model

    shutil.copy(tiny, tmp_path / tiny.name)
    g = load_model(tiny).graph
    wrong = {"blk.0.attn_k.weight": (24, 32), "blk.0.ffn_down.weight": (32, 48)}
    bad = tmp_path / "bad.uaii.json"
    save(dataclasses.replace(g, tensors=tuple(dataclasses.replace(t, shape=wrong[t.name]) if t.name in wrong else t
                                              for t in g.tensors)), bad)
    code, _, err = cli(["run", bad, "-p", "hi"], capsys)
    lines = err.splitlines()
    assert code == 1 and lines[0] == f"error: [validate] {bad}: graph 'tiny' failed validation with 2 problems:"
    assert lines[1].startswith("  [shape] node 3 'blk.0.k/MatMul' (MatMul): output #0 'blk.0.k' is declared")
    assert lines[2].startswith("  [shape] node 18 'blk.0.ffn_down/MatMul' (MatMul): inner dimensions differ")
    assert len(lines) == 3 and "in graph" not in err


def test_a_long_validation_failure_is_capped(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diags = [Diagnostic("shape", f"[validate] node {i} 'n{i}' (MatMul) in graph 'g': wrong", "g", f"n{i}", "MatMul",
                        i) for i in range(40)]

    def failing(path: str, **options: Any) -> Any:
        raise ValidationError("g", diags, "model.uaii")

    code, _, err = cli(["run", tiny, "-p", "hi"], capsys, failing)
    lines = err.splitlines()
    assert code == 1 and lines[0] == "error: [validate] model.uaii: graph 'g' failed validation with 40 problems:"
    assert lines[1] == "  [shape] node 0 'n0' (MatMul): wrong" and lines[-1] == "  ... and 30 more"
    assert len(lines) == 12 and len(err) < 600


# --------------------------------------------------------------------------------------------------- threads
def test_too_many_threads_are_capped_to_the_usable_cores(tiny: Path) -> None:
    """n_threads=1000, UAII_NUM_THREADS=1000 and --threads 1000 all run on the usable cores, with a warning."""
    probe = ("import os, sys; from uaii.runtime import Session; from uaii.kernels import get_num_threads, native\n"
             "kw = {'n_threads': int(sys.argv[2])} if sys.argv[2] != '-' else {}\n"
             "with Session(sys.argv[1], plan_cache=False, **kw) as s: s.generate('hello', max_new_tokens=4)\n"
             "print(get_num_threads(), native.lib.uk_pool_workers_started(), len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if k != "UAII_NUM_THREADS"}
    for n, extra in (("1000", {}), ("-", {"UAII_NUM_THREADS": "1000"})):
        p = subprocess.run([sys.executable, "-c", probe, str(tiny), n], capture_output=True, text=True,
                           env={**env, **extra}, timeout=120)
        assert p.returncode == 0, p.stderr
        threads, started, tasks = map(int, p.stdout.split())
        assert threads == CORES and started <= CORES - 1 and tasks < CORES + 16, (threads, started, tasks)
        assert f"is more than the {CORES} core" in p.stderr and "using" in p.stderr
    run = uaii(["run", tiny, "-p", "hi", "-n", "2", "--threads", "1000"])
    assert run.returncode == 0
    assert (f"warning: [runtime] n_threads=1000 is more than the {CORES} core{'s' if CORES != 1 else ''} this "
            "process may run on").encode() in run.stderr


LOST_INTERRUPT = """
import sys, threading, time, weakref
from uaii.runtime.cli import redelivered_interrupts

class Thing:
    pass

real_start = threading.Thread.start

def slow_start(self):  # a loaded machine: the main thread gets back from starting the redelivering thread late
    real_start(self)
    if self.name == "uaii-redeliver-sigint":
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass

threading.Thread.start = slow_start

def callback(_ref):
    raise KeyboardInterrupt  # where a Ctrl-C lands when it hits importlib's module-lock callback

with redelivered_interrupts():
    try:
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing                          # the callback runs; Python cannot raise from it
        for _ in range(10_000_000):
            pass
        print("lost")
    except KeyboardInterrupt:
        print("delivered")
"""


def test_a_ctrl_c_python_cannot_raise_where_it_lands_is_delivered_again() -> None:
    """Regression: SIGINT during start-up once landed in importlib's weakref callback; Python printed "Exception
    ignored ... KeyboardInterrupt" and the run went on to the end (a flaky failure of the test above). And again:
    delivered after a fixed 2 ms, it landed in the hook itself when the main thread was slow to leave it (CI)."""
    proc = subprocess.run([sys.executable, "-c", LOST_INTERRUPT], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "delivered", (proc.stdout, proc.stderr)
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
