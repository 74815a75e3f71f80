"""The C API functions implemented in Python: argument checks and marshalling between C memory and the adapter.

Imported only inside libuaii (by _bootstrap.start), where cffi's ``ffi``/``lib`` of the embedded module exist.
Every function here is registered with ``ffi.def_extern(name="uaii__py_<name>", onerror=...)``, the cffi stub
that the public ``uaii_<name>`` (a C wrapper that first starts the interpreter) calls: it returns normally on success
(the wrapper clears the thread's last error and returns UAII_OK) and raises on failure; ``onerror`` turns the
exception into a status and the last-error message, so a Python exception never ends as a bare traceback.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from uaii.capi import adapter
from uaii.capi.convert import convert_model
from uaii.capi.options import GenerateConfig, GenerationStats, SessionConfig, field_names
from uaii.capi.status import CapiError, Status, error_message, invalid, status_of

ffi: Any = None
lib: Any = None
_EXPORTS: list[tuple[Callable[..., None], bool]] = []
_sessions: dict[int, adapter.CapiSession] = {}  # handle address -> session
_handles: dict[int, Any] = {}  # handle address -> the cdata that keeps the address alive until destroy


def export(fn: Callable[..., None]) -> Callable[..., None]:
    _EXPORTS.append((fn, False))
    return fn


def export_void(fn: Callable[..., None]) -> Callable[..., None]:
    _EXPORTS.append((fn, True))
    return fn


def install(ffi_: Any, lib_: Any) -> None:
    """Register every function of this module with the library."""
    global ffi, lib
    ffi, lib = ffi_, lib_
    for fn, void in _EXPORTS:
        stub = "uaii__py_" + fn.__name__.removeprefix("uaii_")  # the cffi stub behind the public uaii_X
        ffi.def_extern(name=stub, onerror=_on_error(fn.__name__, void))(_on_success(fn, void))


def _on_success(fn: Callable[..., None], void: bool) -> Callable[..., int | None]:
    def call(*args: Any) -> int | None:
        fn(*args)
        lib.uaii__clear_error()
        return None if void else int(Status.OK)

    call.__name__ = fn.__name__
    return call


def _on_error(name: str, void: bool) -> Callable[..., int | None]:
    def on_error(exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> int | None:
        if exc is None:
            exc = (exc_type or RuntimeError)()
        status = status_of(exc)
        message = error_message(name, exc)
        if status == Status.ERR_INTERNAL and tb is not None:
            frame = traceback.extract_tb(tb)[-1]
            message += f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
        if os.environ.get("UAII_DEBUG", "0") not in ("", "0"):
            traceback.print_exception(exc_type or type(exc), exc, tb)
        lib.uaii__set_error(message.encode("utf-8", "replace"))
        return None if void else int(status)

    return on_error


# ---- argument helpers ------------------------------------------------------------------------------------------
def _is_null(p: Any) -> bool:
    return p == ffi.NULL


def _text(p: Any, what: str) -> str:
    if _is_null(p):
        raise invalid(f"{what} must not be NULL")
    raw = ffi.string(p)
    try:
        return str(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise invalid(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _opt_text(p: Any, what: str) -> str | None:
    return None if _is_null(p) else _text(p, what)


def _need(p: Any, what: str) -> None:
    if _is_null(p):
        raise invalid(f"{what} must not be NULL")


def _session(p: Any) -> adapter.CapiSession:
    if _is_null(p):
        raise invalid("session must not be NULL")
    session = _sessions.get(int(ffi.cast("uintptr_t", p)))
    if session is None:
        raise invalid("session is not a live uaii_session (already destroyed, or not from uaii_session_create)")
    return session


def _int64s(p: Any, n: int, what: str) -> list[int]:
    if n == 0:
        return []
    _need(p, what)
    return [int(v) for v in ffi.unpack(ffi.cast("int64_t *", p), n)]


def _sized_struct(p: Any, ctype: str, init_sized: Callable[[Any, int], None]) -> Any:
    """A library-sized copy of the caller's struct: defaults, then the caller's struct_size bytes over them."""
    size = int(p.struct_size)
    lib_size = ffi.sizeof(ctype)
    if size == 0:
        raise CapiError(Status.ERR_ABI, f"{ctype}.struct_size is 0; initialize the struct with {ctype}_init")
    if size > lib_size:
        raise CapiError(Status.ERR_ABI, f"{ctype}.struct_size is {size}, larger than this library's {lib_size} "
                                        f"(a program built against a newer header)")
    for name, fld in ffi.typeof(ctype).fields:
        end = fld.offset + ffi.sizeof(fld.type)
        if fld.offset < size < end:
            raise CapiError(Status.ERR_ABI, f"{ctype}.struct_size {size} ends inside field {name!r} "
                                            f"(bytes {fld.offset}..{end})")
    local = ffi.new(ctype + " *")
    init_sized(local, lib_size)
    ffi.memmove(local, p, size)
    return local


def _struct_values(local: Any, names: list[str], ctype: str) -> dict[str, Any]:
    kinds = dict(ffi.typeof(ctype).fields)
    values: dict[str, Any] = {}
    for name in names:
        value = getattr(local, name)
        if kinds[name].type.kind == "pointer":
            value = _opt_text(value, f"{ctype}.{name}")
        values[name] = value
    return values


def _write_values(values: list[int], out: Any, capacity: int, out_n: Any, what: str) -> None:
    """Size-query convention: *out_n = count; out NULL only asks; a too-small capacity is an error."""
    _need(out_n, "out_n")
    out_n[0] = len(values)
    if _is_null(out):
        return
    if capacity < len(values):
        raise invalid(f"capacity {capacity} is too small for {len(values)} {what} (*out_n tells the count)")
    if values:
        ffi.memmove(out, np.asarray(values, dtype=np.int64), 8 * len(values))


def _write_text(text: str, buf: Any, capacity: int, out_len: Any) -> None:
    _need(out_len, "out_len")
    data = text.encode("utf-8")
    out_len[0] = len(data)
    if _is_null(buf):
        return
    if capacity < len(data) + 1:
        raise invalid(f"capacity {capacity} is too small for {len(data)} bytes of text and the NUL "
                      "(*out_len tells the length)")
    ffi.memmove(buf, data + b"\0", len(data) + 1)


def _truncated_text(text: str, buf: Any, capacity: int) -> None:
    _need(buf, "buf")
    if capacity == 0:
        raise invalid("capacity must be > 0")
    data = text.encode("utf-8")
    if len(data) > capacity - 1:
        data = data[:capacity - 1]
        while data and (data[-1] & 0xC0) == 0x80:  # never end inside a UTF-8 sequence
            data = data[:-1]
        if data and data[-1] >= 0xC0:
            data = data[:-1]
    ffi.memmove(buf, data + b"\0", len(data) + 1)


def _check_generated_out(out: Any, capacity: int, out_n: Any) -> None:
    _need(out_n, "out_n")
    if capacity > 0:
        _need(out, "out_tokens")


def _write_generated(tokens: list[int], out: Any, capacity: int, out_n: Any) -> None:
    """uaii_session_generate's convention: prompt + new tokens, truncated to capacity."""
    kept = tokens[:capacity]
    if kept:
        ffi.memmove(out, np.asarray(kept, dtype=np.int64), 8 * len(kept))
    out_n[0] = len(kept)


# ---- sessions ------------------------------------------------------------------------------------------------
def _session_config(p: Any) -> SessionConfig:
    if _is_null(p):
        return SessionConfig()
    local = _sized_struct(p, "uaii_session_options", lib.uaii_session_options_init_sized)
    return SessionConfig(**_struct_values(local, field_names(SessionConfig), "uaii_session_options"))


@export
def uaii_session_create(path: Any, options: Any, out: Any) -> None:
    _need(out, "out")
    out[0] = ffi.NULL
    session = adapter.CapiSession(_text(path, "path"), _session_config(options))
    handle = ffi.new_handle(session)
    address = int(ffi.cast("uintptr_t", handle))
    _sessions[address] = session
    _handles[address] = handle
    out[0] = ffi.cast("uaii_session *", handle)


@export_void
def uaii_session_destroy(p: Any) -> None:
    if _is_null(p):
        return
    session = _session(p)
    address = int(ffi.cast("uintptr_t", p))
    del _sessions[address]
    del _handles[address]
    session.close()


@export
def uaii_session_set_f32(p: Any, name: Any, data: Any, n: int) -> None:
    session = _session(p)
    key = _text(name, "name")
    if n and _is_null(data):
        raise invalid("data must not be NULL when n > 0")
    values = np.frombuffer(ffi.buffer(ffi.cast("float *", data), 4 * n), dtype=np.float32).copy() if n else \
        np.empty(0, dtype=np.float32)
    session.set_f32(key, values)


@export
def uaii_session_get_f32(p: Any, name: Any, out: Any, capacity: int, out_n: Any) -> None:
    session = _session(p)
    key = _text(name, "name")
    _need(out_n, "out_n")
    values = session.get_f32(key)
    out_n[0] = values.size
    if _is_null(out):
        return
    if capacity < values.size:
        raise invalid(f"capacity {capacity} is too small for tensor {key!r} of {values.size} elements")
    ffi.memmove(out, np.ascontiguousarray(values, dtype=np.float32), 4 * values.size)


@export
def uaii_session_run(p: Any) -> None:
    _session(p).run()


def _prompt(prompt: Any, prompt_n: int) -> list[int]:
    _need(prompt, "prompt_tokens")
    if prompt_n == 0:
        raise invalid("prompt_n must be > 0")
    return _int64s(prompt, prompt_n, "prompt_tokens")


@export
def uaii_session_generate(p: Any, prompt: Any, prompt_n: int, max_new_tokens: int, out: Any, capacity: int,
                          out_n: Any) -> None:
    session = _session(p)
    _check_generated_out(out, capacity, out_n)
    tokens = _prompt(prompt, prompt_n)
    if max_new_tokens < 0:
        raise invalid(f"max_new_tokens must be >= 0, found {max_new_tokens}")
    result = session.generate(tokens, GenerateConfig(max_new_tokens=max_new_tokens))
    _write_generated(result, out, capacity, out_n)


def _generate_config(p: Any) -> tuple[GenerateConfig, Callable[[int, str], bool] | None]:
    if _is_null(p):
        return GenerateConfig(), None
    local = _sized_struct(p, "uaii_generate_params", lib.uaii_generate_params_init_sized)
    scalars = {name: getattr(local, name) for name in
               ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")}
    stop_ids = tuple(_int64s(local.stop_token_ids, local.n_stop_token_ids, "stop_token_ids"))
    stop_strings: tuple[str, ...] = ()
    if local.n_stop_strings:
        _need(local.stop_strings, "stop_strings")
        stop_strings = tuple(_text(local.stop_strings[i], f"stop_strings[{i}]")
                             for i in range(local.n_stop_strings))
    config = GenerateConfig(**scalars, stop_token_ids=stop_ids, stop_strings=stop_strings)
    if _is_null(local.on_token):
        return config, None
    callback, user_data = local.on_token, local.user_data

    def on_token(token: int, piece: str) -> bool:
        data = piece.encode("utf-8")
        return int(callback(user_data, token, data, len(data))) != 0

    return config, on_token


@export
def uaii_session_generate_v2(p: Any, prompt: Any, prompt_n: int, params: Any, out: Any, capacity: int,
                             out_n: Any) -> None:
    session = _session(p)
    _check_generated_out(out, capacity, out_n)
    tokens = _prompt(prompt, prompt_n)
    config, on_token = _generate_config(params)
    result = session.generate(tokens, config, on_token)
    _write_generated(result, out, capacity, out_n)


@export
def uaii_session_profile_summary(p: Any, buf: Any, capacity: int) -> None:
    session = _session(p)
    _truncated_text(session.profile_summary(), buf, capacity)


@export
def uaii_session_write_trace(p: Any, path: Any) -> None:
    session = _session(p)
    session.write_trace(_text(path, "path"))


@export
def uaii_convert_model(input_path: Any, output_path: Any) -> None:
    convert_model(_text(input_path, "input_path"), _text(output_path, "output_path"))


# ---- 0.3.x additions --------------------------------------------------------------------------------------------
@export
def uaii_session_tokenize(p: Any, text: Any, add_special: int, parse_special: int, out: Any, capacity: int,
                          out_n: Any) -> None:
    session = _session(p)
    _need(out_n, "out_n")
    ids = session.tokenize(_text(text, "text"), add_special=bool(add_special), parse_special=bool(parse_special))
    _write_values(ids, out, capacity, out_n, "tokens")


@export
def uaii_session_detokenize(p: Any, tokens: Any, n: int, buf: Any, capacity: int, out_len: Any) -> None:
    session = _session(p)
    _need(out_len, "out_len")
    text = session.detokenize(_int64s(tokens, n, "tokens"))
    _write_text(text, buf, capacity, out_len)


@export
def uaii_session_apply_chat_template(p: Any, messages: Any, n_messages: int, add_generation_prompt: int, buf: Any,
                                     capacity: int, out_len: Any) -> None:
    session = _session(p)
    _need(out_len, "out_len")
    if n_messages:
        _need(messages, "messages")
    turns = [{"role": _text(messages[i].role, f"messages[{i}].role"),
              "content": _text(messages[i].content, f"messages[{i}].content")} for i in range(n_messages)]
    text = session.apply_chat_template(turns, add_generation_prompt=bool(add_generation_prompt))
    _write_text(text, buf, capacity, out_len)


@export
def uaii_session_get_stats(p: Any, out: Any) -> None:
    session = _session(p)
    _need(out, "out")
    size = int(out.struct_size)
    if size == 0:
        raise CapiError(Status.ERR_ABI, "uaii_generation_stats.struct_size is 0; set it to "
                                        "sizeof(uaii_generation_stats)")
    stats: GenerationStats = session.stats
    local = ffi.new("uaii_generation_stats *")
    for name in field_names(GenerationStats):
        setattr(local, name, getattr(stats, name))
    written = min(size, ffi.sizeof("uaii_generation_stats"))
    local.struct_size = written
    ffi.memmove(out, local, written)


@export
def uaii_session_warnings(p: Any, buf: Any, capacity: int, out_len: Any) -> None:
    session = _session(p)
    _write_text("".join(w + "\n" for w in session.warnings), buf, capacity, out_len)
