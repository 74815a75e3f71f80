"""uaii.runtime.presets: the memory presets the CLI applies, byte sizes, MemAvailable."""

from __future__ import annotations

import pytest

from uaii.runtime.presets import (
    GiB,
    KiB,
    MiB,
    PresetError,
    auto_budget,
    format_bytes,
    get_preset,
    mem_available,
    parse_bytes,
    presets,
    resolve,
)


@pytest.mark.parametrize("text, value", [
    ("256MiB", 256 * MiB), ("2GB", 2_000_000_000), ("1048576", 1048576), (" 1.5 G ", 3 * GiB // 2), ("0", 0),
    ("12kb", 12_000), ("12K", 12 * KiB), ("4gib", 4 * GiB), ("1TiB", 1 << 40), ("512b", 512), (".5MiB", MiB // 2),
    (77, 77),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text, needle", [
    ("lots", "cannot read 'lots'"), ("-5MiB", "cannot read"), ("12 parsecs", "unknown unit 'parsecs'"),
    ("", "cannot read"), (-1, ">= 0"), (True, "byte size"), ("1.2.3G", "cannot read"),
])
def test_parse_bytes_errors(text, needle):
    with pytest.raises(PresetError) as info:
        parse_bytes(text)
    assert str(info.value).startswith("[preset] ") and needle in str(info.value)


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1000, 1024, 227 * MiB, 3 * GiB // 2, 5 << 40)] == \
        ["0 B", "1000 B", "1.0 KiB", "227 MiB", "1.5 GiB", "5.0 TiB"]


def test_fixed_presets():
    assert get_preset("tiny").budget_bytes == 256 * MiB
    assert get_preset("Laptop").budget_bytes == 2 * GiB
    assert get_preset("workstation").budget_bytes == 16 * GiB
    un = get_preset("unlimited")
    assert (un.budget_bytes, un.kv_window, un.kv_sinks) == (0, 0, 4)
    for p in presets():
        if p.name != "unlimited":
            assert (p.kv_window, p.kv_sinks) == (2048, 4)
    assert get_preset("tiny").session_options() == {"preset": "tiny", "budget_bytes": 256 * MiB, "kv_window": 2048,
                                                    "kv_sinks": 4, "kv_dtype": "f16"}
    with pytest.raises(PresetError, match="unknown preset 'huge'; known: tiny, laptop"):
        get_preset("huge")


def test_auto_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   16777216 kB\n")
    assert mem_available(str(meminfo)) == 16 * GiB
    auto = get_preset("auto", meminfo=str(meminfo))
    assert auto.budget_bytes == 8 * GiB and auto.kv_window == 2048
    assert "16.0 GiB" in auto.description
    assert mem_available(str(tmp_path / "missing")) >= 0  # falls back to sysconf


def test_auto_budget_is_stable_from_run_to_run():
    assert auto_budget(22 * GiB + 12345) == auto_budget(22 * GiB + 300 * MiB) == 11 * GiB
    assert auto_budget(3 * GiB) == 1536 * MiB
    assert auto_budget(1500 * MiB) == 704 * MiB
    assert auto_budget(10 * MiB) == 5 * MiB and auto_budget(0) == 0


def test_resolve_is_what_the_cli_runs_with():
    assert resolve().name == "auto"
    assert resolve("tiny").budget_bytes == 256 * MiB
    r = resolve("unlimited", "1GiB")
    assert (r.name, r.budget_bytes, r.kv_window) == ("unlimited", GiB, 0)
    assert resolve(None, 123).budget_bytes == 123
    assert "budget 256 MiB, kv window 2048 f16" in resolve("tiny").describe()
    assert resolve("unlimited").describe() == "unlimited (budget unlimited, kv window unbounded f16)"


def test_session_options_accept_a_preset():
    from uaii.runtime import SessionOptions

    opts = SessionOptions.from_kwargs({"preset": "tiny"})
    assert (opts.budget_bytes, opts.kv_window, opts.kv_sinks) == (256 * MiB, 2048, 4)
    opts = SessionOptions.from_kwargs({"preset": "tiny", "budget_bytes": 5})
    assert opts.budget_bytes == 5
