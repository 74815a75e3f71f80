"""PyTorch checkpoints without torch in the product (issue #15): what transformers and torch.save write loads and
computes transformers' logits; what a hostile file holds is refused before anything of it runs.

The references (torch, transformers) write the fixtures and compute the expected logits; uaii reads the files with
its own pickle machine (uaii.loaders.torch_pickle). Every malicious pickle here would create a marker file if any
of it were executed; the tests check the marker is never there, and each error names the file and offset.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest
from test_numerics import _feeds, _transformers_outputs, run_graph

from uaii.ir import FormatError
from uaii.loaders import load_model
from uaii.loaders.torch_checkpoint import open_torch

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ARCHS = ("llama", "qwen2", "gemma3", "gpt2", "mixtral")


@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_bin_matches_transformers(tmp_path: Path, arch: str) -> None:
    """pytorch_model.bin (one file; tied embeddings share a storage) and the sharded form with its index."""
    for name, kw in (("single", {}), ("sharded", {"max_shard_size": "20KB"})):
        d = H.save_tiny(arch, tmp_path / name, safe=False, **kw)
        assert not list(d.glob("*.safetensors")) and list(d.glob("pytorch_model*.bin"))
        if name == "sharded":
            assert (d / "pytorch_model.bin.index.json").is_file()
        want = _transformers_outputs(arch, d)
        m = load_model(d)
        got = run_graph(m, _feeds(m))
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5, err_msg=f"{arch} {name}")


def test_legacy_format_and_training_checkpoint(tmp_path: Path) -> None:
    """torch.save's pre-1.6 format (pickles, then raw storages), and a training checkpoint whose "model" entry
    holds the weights (the optimizer state and the rest are skipped, by name)."""
    d = H.save_tiny("llama", tmp_path / "llama", safe=False)
    want = _transformers_outputs("llama", d)
    sd = torch.load(d / "pytorch_model.bin", weights_only=True)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((d / "config.json").read_text())
    torch.save(sd, legacy / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert (legacy / "pytorch_model.bin").read_bytes()[:2] != b"PK"
    training = tmp_path / "training"
    training.mkdir()
    (training / "config.json").write_text((d / "config.json").read_text())
    torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}, "epoch": 3},
               training / "pytorch_model.bin")
    for root in (legacy, training):
        m = load_model(root)
        np.testing.assert_allclose(run_graph(m, _feeds(m))["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    assert open_torch(training).skipped == ["epoch", "optimizer"]


def test_dtypes_views_and_shared_storages(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sd = {"f32": base, "row_view": base[2:4], "tied": base, "bf16": base.to(torch.bfloat16),
          "f16": base.to(torch.float16), "i64": torch.arange(5), "flag": torch.tensor([True, False])}
    for zipped in (True, False):
        path = tmp_path / f"c{int(zipped)}.bin"
        torch.save(sd, path, _use_new_zipfile_serialization=zipped)
        ck = open_torch(path)
        data = path.read_bytes()
        for name, t in sd.items():
            info = ck.tensors[name]
            assert info.shape == tuple(t.shape)
            ref = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()
            assert data[info.offset:info.end] == ref, (zipped, name)
        assert ck.tensors["tied"].offset == ck.tensors["f32"].offset  # one storage, one copy of the bytes


def test_strided_views_and_lies_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    torch.save({"t": torch.zeros(4, 6).t()}, path)
    with pytest.raises(FormatError, match="strided view"):
        open_torch(path)
    torch.save({"w": torch.zeros(8)}, path)  # a tensor larger than its storage: shape (8,) -> (80,)
    members = _members(path)
    _archive(path, {n: d.replace(b"K\x08\x85", b"KP\x85") if n.endswith("data.pkl") else d
                    for n, d in members.items()})
    with pytest.raises(FormatError, match=r"spans elements 0\.\.80 of storage .0., which holds 8"):
        open_torch(path)
    corrupt = bytearray(path.read_bytes())  # the pickle's bytes changed under its CRC
    corrupt[corrupt.find(b"FloatStorage")] ^= 1
    path.write_bytes(bytes(corrupt))
    with pytest.raises(FormatError, match="Bad CRC-32"):
        open_torch(path)


def test_torchscript_archive_is_named(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(FormatError, match="TorchScript"):
        open_torch(path)


# --- malicious files ------------------------------------------------------------------------------------------------
def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _archive(path: Path, members: dict[str, bytes], deflated: tuple[str, ...] = ()) -> None:
    """A zip of ``members`` in their order, stored (deflated: those whose name holds one of ``deflated``)."""
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data, zipfile.ZIP_DEFLATED if any(x in n for x in deflated) else zipfile.ZIP_STORED)


def _zip_with(pkl: bytes, extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", b"3\n")
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return buf.getvalue()


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _corpus(marker: Path) -> dict[str, bytes]:
    """Pickles that would create ``marker`` if any of them ran (each a different way in)."""
    cmd = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"

    class Reduce:
        def __init__(self, fn: Any, *args: Any) -> None:
            self.fn, self.args = fn, args

        def __reduce__(self) -> Any:
            return self.fn, self.args

    import builtins
    import os
    import subprocess

    out = {
        "os.system": pickle.dumps(Reduce(os.system, cmd), protocol=2),
        "subprocess.call": pickle.dumps(Reduce(subprocess.call, ["touch", str(marker)]), protocol=2),
        "builtins.eval": pickle.dumps(Reduce(builtins.eval, code), protocol=2),
        "builtins.exec": pickle.dumps(Reduce(builtins.exec, code), protocol=4),
        "stack_global_exec": pickle.dumps(Reduce(builtins.exec, code), protocol=4),  # proto 4: STACK_GLOBAL
        "getattr_chain": b"\x80\x02" + _global("builtins", "getattr") + _global("builtins", "__import__")
        + b"(" + _str("os") + b"tR" + _str("system") + b"\x86R(" + _str(cmd) + b"tR.",
        "inst": b"(" + _str(cmd) + b"ios\nsystem\n.",
        "obj": b"(" + _global("os", "system") + _str(cmd) + b"o.",
        "newobj": b"\x80\x02" + _global("subprocess", "Popen") + b"(]" + _str("touch") + b"a" + _str(str(marker))
        + b"a\x85\x81.",
        "newobj_ex": b"\x80\x04" + _global("subprocess", "Popen") + b"]" + _str("touch") + b"a" + _str(str(marker))
        + b"a\x85}\x92.",
        "build_setstate": b"\x80\x02" + _global("collections", "OrderedDict") + b")R"
        + _global("builtins", "exec") + b"b.",
        "build_dict_state_on_object": b"\x80\x02" + _global("torch._utils", "_rebuild_parameter") + b"}b.",
        "setitem_on_nondict": b"\x80\x02" + _global("collections", "OrderedDict") + b")R]" + _str("k") + _str("v")
        + b"s.",
        "setitems_on_global": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"(" + _str("a")
        + _str("b") + b"u.",
        "append_to_tuple": b"\x80\x02)" + _str("x") + b"a.",
        "ordered_dict_with_args": b"\x80\x02" + _global("collections", "OrderedDict") + b"(" + _global("os", "system")
        + b"tR.",
        "reduce_storage_tag": b"\x80\x02" + _global("torch", "FloatStorage") + _str(cmd) + b"\x85R.",
        "torch_load_itself": b"\x80\x02" + _global("torch", "load") + _str("/etc/passwd") + b"\x85R.",
        "numpy_reconstruct": b"\x80\x02" + _global("numpy.core.multiarray", "_reconstruct") + b")R.",
        "ext1": b"\x80\x02\x82\x01.",
        "ext2": b"\x80\x02\x83\x01\x00.",
        "ext4": b"\x80\x02\x84\x01\x00\x00\x00.",
        "persid_text": b"P" + cmd.encode() + b"\n.",
        "rebuild_on_string_storage": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"("
        + _str("storage") + b"K\x00)" + b")" + b"\x89" + _global("collections", "OrderedDict") + b")R" + b"tR.",
        "memo_unset": b"\x80\x02h\x05.",
        "deep_nesting": b"\x80\x02" + b"(" * 100 + b")" + b"t" * 100 + b".",
        "huge_string_claim": b"\x80\x02X\xff\xff\xff\x7f" + b"a" * 16 + b".",
        "huge_int": b"\x80\x02\x8a\xff" + b"\x01" * 255 + b".",
        "no_stop": b"\x80\x02" + _str("x"),
        "pop_empty": b"\x80\x020.",
        "nested_pickle_bytes": b"\x80\x02C" + bytes([len(pickle.dumps(Reduce(os.system, cmd)))])
        + pickle.dumps(Reduce(os.system, cmd)) + b".",
        "global_name_with_dot_path": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2.__globals__") + b".",
        "stack_global_non_string": b"\x80\x04K\x01K\x02\x93.",
        "storage_type_is_os_system": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"(("
        + _str("storage") + _global("os", "system") + _str(cmd) + _str("cpu") + b"K\x01tQ.",
        "parameter_state_with_global": b"\x80\x02" + _global("torch._utils", "_rebuild_parameter_with_state")
        + b"(N\x89}" + _global("builtins", "exec") + b"tR.",
        "unhashable_key": b"\x80\x02}]K\x01s.",
        "protocol_6": b"\x80\x06N.",
        "bytearray8": b"\x80\x05\x96" + struct.pack("<Q", 3) + b"abc.",
        "next_buffer": b"\x80\x05\x97.",
        "self_append_cycle": b"\x80\x02]q\x00h\x00a.",
        "module_object": pickle.dumps(torch.nn.Linear(2, 2), protocol=2),
        "rebuild_v3_bad_dtype": b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v3") + b"(NK\x00)\x29\x89}"
        + _global("os", "system") + b"tR.",
        "copyreg_reconstructor": b"\x80\x02" + _global("copyreg", "_reconstructor") + b"(" + _global("os", "system")
        + _global("builtins", "object") + b"NtR.",
    }
    return out


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch.load's remark on the protocol 4-6 cases
def test_malicious_pickles_are_refused_and_never_run(tmp_path: Path, capsys: Any) -> None:
    marker = tmp_path / "MARKER"
    corpus = _corpus(marker)
    assert len(corpus) >= 40
    results = {}
    for name, pkl in corpus.items():
        for form in ("zip", "legacy"):
            path = tmp_path / f"{name}.{form}.bin"
            path.write_bytes(_zip_with(pkl) if form == "zip" else pkl)
            with pytest.raises(FormatError) as err:
                open_torch(path)
            assert str(path.resolve()) in str(err.value) or path.name in str(err.value)
            results[f"{name}.{form}"] = str(err.value).split(": ", 2)[-1][:100]
        assert not marker.exists(), f"{name} ran"
    with pytest.raises(FormatError, match=r"refused global torch\.nn\.modules\.linear\.Linear.*save "
                                          r"model\.state_dict\(\) instead"):
        open_torch(tmp_path / "module_object.zip.bin")
    # torch's own weights_only loader on the same corpus, for the log (not asserted: it is what we compare with)
    lines = []
    for name, pkl in corpus.items():
        try:
            torch.load(io.BytesIO(_zip_with(pkl)), weights_only=True)
            verdict = "loaded"
        except Exception as exc:  # whatever torch raises is the comparison
            verdict = type(exc).__name__
        lines.append(f"{name:28s} uaii: {results[name + '.zip'][:70]:70s} torch weights_only: {verdict}")
    assert not marker.exists()
    with capsys.disabled():  # into the test log whatever pytest's capture settings
        print("\nhostile pickles (zip form): uaii's refusal vs torch.load(weights_only=True)\n" + "\n".join(lines))


def test_archive_tricks_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.bin"
    torch.save({"w": torch.zeros(4)}, good)
    members = _members(good)
    prefix = next(n for n in members if n.endswith("data.pkl"))[:-len("data.pkl")]
    # a second data.pkl (a file that means one thing to one reader and another to the next)
    two = tmp_path / "two.bin"
    _archive(two, {**members, "other/data.pkl": members[prefix + "data.pkl"]})
    with pytest.raises(FormatError, match=r"one <name>/data\.pkl"):
        open_torch(two)
    # a compressed storage cannot be read in place
    comp = tmp_path / "comp.bin"
    _archive(comp, members, deflated=("/data/",))
    with pytest.raises(FormatError, match="compressed"):
        open_torch(comp)
    # a storage member missing
    miss = tmp_path / "miss.bin"
    _archive(miss, {n: d for n, d in members.items() if "/data/" not in n})
    with pytest.raises(FormatError, match="has no member"):
        open_torch(miss)
    # a billion-element storage claim
    big = tmp_path / "big.bin"
    pkl = members[prefix + "data.pkl"].replace(b"K\x04", b"J\x00\xca\x9a\x3b", 1)
    _archive(big, {n: pkl if n.endswith("data.pkl") else d for n, d in members.items()})
    with pytest.raises(FormatError, match="claims 1000000000 elements"):
        open_torch(big)
    # a big-endian archive: its tensors would be byte-swapped
    swapped = tmp_path / "swapped.bin"
    _archive(swapped, {n: b"big" if n.endswith("byteorder") else d for n, d in members.items()})
    with pytest.raises(FormatError, match="byteorder is b'big'"):
        open_torch(swapped)
    # a central directory whose compressed size lies (zipfile sizes its read by it: found by the fuzz, a 1 GiB read)
    for member in ("byteorder", "data.pkl"):
        lying = tmp_path / f"lying_{member}.bin"
        raw = bytearray(good.read_bytes())
        with zipfile.ZipFile(good) as z:
            name = next(n for n in z.namelist() if n.endswith(member))
        central = raw.index(b"PK\x01\x02")  # the central directory's entries, until the member's
        while not raw[central + 46:].startswith(name.encode()):
            central = raw.index(b"PK\x01\x02", central + 4)
        raw[central + 20:central + 24] = struct.pack("<I", 1 << 30)  # compressed size
        lying.write_bytes(bytes(raw))
        with pytest.raises(FormatError, match=rf"{member.replace('.', '[.]')} is \d+ bytes, stored in 1073741824"):
            open_torch(lying)
    legacy = tmp_path / "legacy.bin"
    torch.save({"w": torch.zeros(4)}, legacy, _use_new_zipfile_serialization=False)
    raw = bytearray(legacy.read_bytes())
    flag = raw.index(b"\x88", raw.index(b"little_endian"))  # NEWTRUE -> NEWFALSE
    raw[flag] = 0x89
    legacy.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="not marked little-endian"):
        open_torch(legacy)
    # an index naming a shard outside the directory
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "../good.bin"}}))
    with pytest.raises(FormatError, match="plain file name"):
        open_torch(d)
