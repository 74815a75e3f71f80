"""The `uaii` command line against a fake Session: parsing, presets, streaming, --json, errors and exit codes.

The fake follows the Session contract (generate / stream / last_result / tokenize / close, GenerationResult with
GenerationStats); commands that need no Session (tokenize, inspect, convert, cache, presets) run for real.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from uaii.runtime.cli import build_parser, main
from uaii.runtime.presets import GiB, MiB
from uaii.runtime.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------- the fake
@dataclass
class FakeStats:
    prompt_tokens: int
    new_tokens: int
    ttft_s: float = 0.012
    prefill_s: float = 0.01
    prefill_tok_s: float = 400.0
    decode_s: float = 0.05
    decode_tok_s: float = 140.0
    peak_rss_bytes: int = 200 * MiB
    load_s: float = 0.1
    plan_cache_hit: bool = False
    bytes_read_per_token: int = 0

    def to_dict(self):
        return asdict(self)


@dataclass
class FakeResult:
    text: str
    tokens: list[int]
    prompt_tokens: list[int]
    finish_reason: str
    stats: FakeStats


@dataclass
class FakeTokenizer:
    calls: list = field(default_factory=list)

    def encode_chat(self, messages, add_generation_prompt=True):
        self.calls.append([dict(m) for m in messages])
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [1] + [ord(c) for c in text]


class FakeSession:
    """Answers with the reversed prompt text, one character per token."""

    opened: ClassVar[list[FakeSession]] = []

    def __init__(self, path, **options):
        self.path = path
        self.options = options
        self.calls: list[dict] = []
        self.tokenizer = FakeTokenizer()
        self.last_result = None
        self.closed = False
        self.model_info = {"arch": "fake", "n_params": 42}
        self.resets = 0
        FakeSession.opened.append(self)

    def tokenize(self, text, add_special=True):
        return ([1] if add_special else []) + [ord(c) for c in text]

    def detokenize(self, ids):
        return "".join(chr(i) for i in ids if i > 1)

    def _run(self, prompt, max_new_tokens=128, sampling=None, stop=(), stop_token_ids=(), add_special=True, **kw):
        ids = list(prompt) if not isinstance(prompt, str) else self.tokenize(prompt, add_special)
        self.calls.append({"prompt": ids, "max_new_tokens": max_new_tokens, "sampling": sampling, "stop": stop,
                           "add_special": add_special, **kw})
        body = [i for i in ids if i > 1][::-1][:max_new_tokens] or [ord("x")]
        text = "".join(chr(i) for i in body)
        reason = "length" if len(body) == max_new_tokens else "stop"
        return FakeResult(text, body, ids, reason, FakeStats(len(ids), len(body)))

    def generate(self, prompt, **kw):
        self.last_result = self._run(prompt, **kw)
        return self.last_result

    def stream(self, prompt, **kw):
        result = self._run(prompt, **kw)
        for i in range(0, len(result.text), 2):
            yield result.text[i:i + 2]
        self.last_result = result

    def reset(self):
        self.resets += 1

    def close(self):
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    FakeSession.opened.clear()
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("UAII_DEBUG", raising=False)


@pytest.fixture
def model_file(tmp_path) -> Path:
    p = tmp_path / "model.gguf"
    p.write_bytes(b"not read by the fake session")
    return p


def run(argv, capsys, factory=FakeSession):
    code = main([str(a) for a in argv], session_factory=factory)
    out, err = capsys.readouterr()
    return code, out, err


# -------------------------------------------------------------------------------------------------- parsing
def test_parser_has_every_command():
    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "command")
    assert set(sub.choices) >= {"run", "chat", "tokenize", "detokenize", "inspect", "convert", "bench", "devices",
                                "cache", "plan", "presets"}
    args = ap.parse_args(["run", "m.gguf", "-p", "hi", "-n", "8", "--temp", "0.7", "--top-k", "40", "--top-p", "0.9",
                          "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "3", "--chat", "--json",
                          "--threads", "2", "--preset", "tiny", "--budget", "1GiB", "--system", "be brief"])
    assert (args.model, args.prompt, args.max_tokens, args.temp, args.top_k, args.top_p, args.min_p,
            args.repeat_penalty, args.seed, args.chat, args.json, args.threads, args.preset, args.budget,
            args.system) == ("m.gguf", "hi", 8, 0.7, 40, 0.9, 0.05, 1.1, 3, True, True, 2, "tiny", "1GiB", "be brief")


@pytest.mark.parametrize("argv, needle", [
    ([], "required"),
    (["fly"], "invalid choice"),
    (["run", "m.gguf"], "-p/--prompt"),
    (["run", "m.gguf", "-p", "x", "-n", "many"], "invalid int value"),
    (["run", "m.gguf", "-p", "x", "--preset", "huge"], "invalid choice"),
    (["cache", "purge"], "invalid choice"),
])
def test_usage_errors_are_one_line_and_exit_1(argv, needle, capsys):
    code, out, err = run(argv, capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: [cli] ") and needle in err


def test_help_and_version_exit_0(capsys):
    assert main(["--help"]) == 0
    assert "run" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("uaii ")


# ------------------------------------------------------------------------------------------------------ run
def test_run_streams_then_prints_a_stats_line(model_file, capsys):
    code, out, err = run(["run", model_file, "-p", "abc", "-n", "8"], capsys)
    assert code == 0
    assert out == "cba\n"
    [line] = err.strip().splitlines()
    for part in ("prompt 4 tok", "new 3 tok (stop)", "ttft 12 ms", "prefill 400.0 tok/s", "decode 140.0 tok/s",
                 "peak RSS 200 MiB", "preset auto"):
        assert part in line
    (s,) = FakeSession.opened
    assert s.closed
    call = s.calls[0]
    assert call["max_new_tokens"] == 8 and call["add_special"] is True
    assert call["sampling"] == SamplingParams()  # greedy by default


def test_run_json_is_exactly_one_object_with_the_contract_keys(model_file, capsys):
    code, out, err = run(["run", model_file, "-p", "hello", "-n", "3", "--json"], capsys)
    assert code == 0 and err == ""
    obj = json.loads(out)
    assert out.count("\n") == 1
    assert {"text", "tokens", "prompt_tokens", "prefill_tok_s", "decode_tok_s", "ttft_s",
            "peak_rss_bytes"} <= set(obj)
    assert obj["text"] == "oll" and obj["tokens"] == [ord("o"), ord("l"), ord("l")]
    assert obj["prompt_tokens"] == [1, *map(ord, "hello")]
    assert obj["decode_tok_s"] == 140.0 and obj["peak_rss_bytes"] == 200 * MiB
    assert obj["finish_reason"] == "length" and obj["stats"]["new_tokens"] == 3
    assert obj["preset"]["name"] == "auto" and obj["sampling"]["temperature"] == 0.0


def test_run_sampling_options_reach_the_session(model_file, capsys):
    code, _, err = run(["run", model_file, "-p", "x", "--temp", "0.7", "--top-k", "40", "--top-p", "0.9",
                        "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "3"], capsys)
    assert code == 0 and "note" not in err
    assert FakeSession.opened[0].calls[0]["sampling"] == SamplingParams(0.7, 40, 0.9, 0.05, 1.1, 3)


def test_filters_without_temperature_stay_greedy_and_say_so(model_file, capsys):
    code, _, err = run(["run", model_file, "-p", "x", "--top-k", "5"], capsys)
    assert code == 0 and "--top-k has no effect with greedy decoding" in err
    assert FakeSession.opened[0].calls[0]["sampling"].greedy


@pytest.mark.parametrize("flags, needle", [
    (["--temp", "-1"], "[sampling] temperature"),
    (["--top-p", "0"], "[sampling] top_p"),
    (["--budget", "lots"], "[preset] cannot read 'lots'"),
    (["--threads", "0"], "[cli] --threads"),
    (["-n", "-2"], "[cli] -n"),
    (["--system", "s"], "[cli] --system needs --chat"),
    (["--kv-window", "-1"], "[cli] --kv-window must be >= 0"),
    (["--kv-sinks", "-2"], "[cli] --kv-sinks must be >= 0"),
])
def test_bad_option_values_are_one_line_errors(model_file, flags, needle, capsys):
    code, out, err = run(["run", model_file, "-p", "x", *flags], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1
    assert not FakeSession.opened  # nothing was loaded


@pytest.mark.parametrize("flags, budget, window", [
    ([], None, 2048),
    (["--preset", "tiny"], 256 * MiB, 2048),
    (["--preset", "unlimited"], 0, 0),
    (["--preset", "laptop", "--budget", "1GiB"], GiB, 2048),
    (["--budget", "512MiB"], 512 * MiB, 2048),
])
def test_the_cli_applies_a_preset(model_file, flags, budget, window, capsys):
    assert run(["run", model_file, "-p", "x", "--threads", "2", *flags], capsys)[0] == 0
    opts = FakeSession.opened[0].options
    assert opts["kv_window"] == window and opts["kv_sinks"] == 4 and opts["n_threads"] == 2
    if budget is None:
        assert opts["preset"] == "auto" and opts["budget_bytes"] > 0
    else:
        assert opts["budget_bytes"] == budget


def test_kv_flags_reach_the_session(model_file, capsys):
    argv = ["run", model_file, "-p", "x", "--kv-window", "512", "--kv-sinks", "2", "--kv-positions", "cache",
            "--kv-dtype", "f16"]
    code, out, err = run(argv, capsys)
    assert code == 0 and "kv window 512 f16" in out + err
    opts = FakeSession.opened[0].options
    assert (opts["kv_window"], opts["kv_sinks"], opts["kv_positions"], opts["kv_dtype"]) == (512, 2, "cache", "f16")
    assert run(["run", model_file, "-p", "x", "--kv-window", "0"], capsys)[0] == 0
    opts = FakeSession.opened[-1].options
    assert opts["kv_window"] == 0 and "kv_positions" not in opts and opts["kv_dtype"] == "f16"   # the preset's
    assert run(["run", model_file, "-p", "x", "--kv-dtype", "f32"], capsys)[0] == 0
    assert FakeSession.opened[-1].options["kv_dtype"] == "f32"


def test_run_chat_uses_the_template(model_file, capsys):
    code, out, _ = run(["run", model_file, "--chat", "--system", "S", "-p", "Q", "-n", "64"], capsys)
    assert code == 0
    s = FakeSession.opened[0]
    assert s.tokenizer.calls == [[{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]]
    assert s.calls[0]["add_special"] is False
    assert out == ">tnatsissa<Q>resu<S>metsys<\n"


def test_prompt_from_stdin(model_file, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("xyz"))
    assert run(["run", model_file, "-p", "-"], capsys)[1] == "zyx\n"


# ------------------------------------------------------------------------------------------------ errors
def test_missing_model_file_is_one_line(tmp_path, capsys):
    code, out, err = run(["run", tmp_path / "nope.gguf", "-p", "x"], capsys)
    assert code == 1 and out == ""
    assert err == f"error: [cli] {tmp_path / 'nope.gguf'}: no such file or directory (expected a GGUF file or a " \
                  "Hugging Face model directory)\n"


def corrupt_gguf(tmp_path: Path) -> Path:
    """A GGUF header that promises 3 tensors and 1,000,000 metadata pairs, then ends."""
    p = tmp_path / "corrupt.gguf"
    p.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (3).to_bytes(8, "little") + (10**6).to_bytes(8, "little")
                  + b"\x05\x00\x00\x00\x00\x00\x00\x00gener")
    return p


@pytest.mark.parametrize("command", [["inspect"], ["convert", "{out}"], ["plan"], ["tokenize", "hi"],
                                     ["run", "-p", "x"], ["bench"], ["chat"]])
def test_corrupt_gguf_is_one_line_and_exit_1(tmp_path, command, capsys):
    bad = corrupt_gguf(tmp_path)
    argv = [command[0], bad, *[c.format(out=tmp_path / "o.uaii") for c in command[1:]]]
    code, out, err = run(argv, capsys, factory=None)  # the real Session
    assert code == 1 and out == ""
    assert err.startswith("error: [") and err.count("\n") == 1 and "Traceback" not in err
    assert "corrupt.gguf" in err
    assert not (tmp_path / "o.uaii").exists()


def test_session_errors_become_one_line(model_file, capsys):
    from uaii.ir import FormatError

    def broken(path, **options):
        raise FormatError("tensor 'x' runs past end of file", path=path, offset=0x1F000, component="gguf")

    code, _, err = run(["run", model_file, "-p", "x"], capsys, factory=broken)
    assert code == 1 and err.startswith("error: [gguf] ") and "0x1f000" in err


def test_unexpected_exceptions_are_one_line_unless_debugging(model_file, capsys, monkeypatch):
    def buggy(path, **options):
        raise ZeroDivisionError("oops")

    code, _, err = run(["run", model_file, "-p", "x"], capsys, factory=buggy)
    assert code == 1 and err == "error: [internal] ZeroDivisionError: oops (UAII_DEBUG=1 shows the traceback)\n"
    monkeypatch.setenv("UAII_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["run", str(model_file), "-p", "x"], session_factory=buggy)


def test_keyboard_interrupt_exits_130(model_file, capsys):
    class Interrupted(FakeSession):
        def stream(self, prompt, **kw):
            yield "par"
            raise KeyboardInterrupt

    code, out, err = run(["run", model_file, "-p", "x"], capsys, factory=Interrupted)
    assert code == 130 and out.startswith("par") and "interrupted" in err
    assert FakeSession.opened[0].closed


# ------------------------------------------------------------------------------------------------------ chat
def test_chat_repl_keeps_history_and_resets(model_file, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n\nyo\n/reset\nagain\n/stats\n/help\n/exit\nnever\n"))
    code, out, err = run(["chat", model_file, "--system", "S"], capsys)
    assert code == 0
    calls = FakeSession.opened[0].tokenizer.calls
    assert [len(c) for c in calls] == [2, 4, 2]  # system+user; +assistant+user; after /reset
    assert calls[1][2]["role"] == "assistant" and calls[1][3] == {"role": "user", "content": "yo"}
    assert calls[2][1] == {"role": "user", "content": "again"}
    assert out.count("\n") == 3  # three answers
    assert "(conversation reset)" in err and "/reset forgets" in err and "decode 140.0 tok/s" in err
    assert FakeSession.opened[0].closed


def test_chat_ends_at_end_of_input(model_file, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\n"))
    code, out, _ = run(["chat", model_file], capsys)
    assert code == 0 and out.count("\n") == 1


# ----------------------------------------------------------------------------------------------------- bench
def test_bench_json(model_file, capsys):
    code, out, _ = run(["bench", model_file, "--json", "--prompt-tokens", "40", "--gen-tokens", "8"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["prompt_tokens"] == 40 and obj["gen_tokens"] == 8 and obj["new_tokens"] == 8
    assert obj["prefill_tok_s"] == 400.0 and obj["decode_tok_s"] == 140.0
    assert obj["peak_rss_bytes"] >= 200 * MiB and obj["load_s"] >= 0 and obj["architecture"] == "fake"
    s = FakeSession.opened[0]
    measured = s.calls[-1]
    assert measured["prompt"][0] == 1 and len(measured["prompt"]) == 40  # BOS + the fixed text, cut to 40
    assert s.resets == 1  # the warm-up's KV is forgotten before the measured run (see test_bench_measures.py)
    assert measured["sampling"].greedy and measured["add_special"] is False


def test_bench_sizes_the_kv_cache_for_its_tokens(model_file, capsys):
    """The preset's 2048-token window would reserve a KV cache the benchmark never fills (under a budget the planner
    counts it: SmolLM2's 90 MiB made a 46 MiB budget impossible); bench holds prompt + generated tokens."""
    code, _, _ = run(["bench", model_file, "--json", "--prompt-tokens", "40", "--gen-tokens", "8", "--budget",
                      "64MiB"], capsys)
    assert code == 0
    opts = FakeSession.opened[-1].options
    assert opts["kv_window"] == 0 and opts["max_context"] == 48 and opts["budget_bytes"] == 64 * MiB
    from uaii.runtime.cli.bench import kv_for_bench

    assert kv_for_bench({"kv_window": 16, "kv_sinks": 4}, 48) == {}  # a window smaller than the run stays


def test_bench_table(model_file, capsys):
    code, out, _ = run(["bench", model_file, "--prompt-tokens", "16", "--gen-tokens", "4", "--warmup", "0"], capsys)
    assert code == 0 and "prefill (16 tokens)" in out and "400.0 tok/s" in out


# ------------------------------------------------------------------------------------------- system commands
def test_presets_json(capsys):
    code, out, _ = run(["presets", "--json"], capsys)
    obj = json.loads(out)
    assert code == 0 and obj["default"] == "auto"
    by_name = {p["name"]: p for p in obj["presets"]}
    assert by_name["tiny"]["budget_bytes"] == 256 * MiB and by_name["unlimited"]["kv_window"] == 0
    assert {p["kv_dtype"] for p in obj["presets"]} == {"f16"}


def test_cache_status_and_clear_on_a_temp_cache(tmp_path, capsys):
    plans = tmp_path / "cache" / "plans"
    plans.mkdir(parents=True)
    for key in ("ab" * 32, "cd" * 32):
        (plans / f"{key}.json").write_text("{}" * 50)
    code, out, _ = run(["cache", "status", "--json"], capsys)
    assert code == 0 and json.loads(out) == {"path": str(plans), "entries": 2, "total_bytes": 200}
    code, out, _ = run(["cache", "status"], capsys)
    assert f"plan cache {plans}: 2 entries, 200 B" in out
    code, out, _ = run(["cache", "clear"], capsys)
    assert code == 0 and "removed 2 plan cache entries" in out
    assert list(plans.iterdir()) == []
    assert json.loads(run(["cache", "status", "--json"], capsys)[1])["entries"] == 0


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("uaii")
    proc = subprocess.run([str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else
                          ["-m", "uaii.runtime.cli"]), "presets", "--no-color"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"}, timeout=120)
    assert proc.returncode == 0 and "workstation" in proc.stdout and "\x1b[" not in proc.stdout


def test_devices_lists_every_backend(capsys):
    code, out, _ = run(["devices", "--json"], capsys)
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)["backends"]}
    assert list(rows)[:6] == ["cpu", "cuda", "rocm", "metal", "vulkan", "webgpu"]
    assert rows["cpu"]["available"] and rows["cpu"]["devices"]
    for r in rows.values():
        assert r["available"] or r["reason"]  # unavailable always says why
    code, out, _ = run(["devices"], capsys)
    assert code == 0 and "cpu" in out and "webgpu" in out
