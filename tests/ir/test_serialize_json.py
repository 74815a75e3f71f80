"""The canonical .uaii.json: its exact rules, the C++ runtime's spellings, and errors with path and offset."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
import serialize_support as S

from uaii.ir import DType, FormatError, Graph, GraphError, Node, StorageHint, Tensor
from uaii.ir.serialize import dumps_json, loads_json
from uaii.ir.serialize._floats import float_from_bits, float_text, parse_float_text


def doc_of(g: Graph) -> dict[str, Any]:
    return json.loads(dumps_json(g))


def error_of(text: str | bytes) -> FormatError:
    with pytest.raises(FormatError) as e:
        loads_json(text, path="m.uaii.json")
    assert e.value.path == "m.uaii.json"
    assert e.value.offset is not None
    return e.value


# --- canonical form -----------------------------------------------------------------------------------------
def test_canonical_text_is_sorted_indented_utf8_with_final_newline() -> None:
    g = S.rich_graph()
    text = dumps_json(g)
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert "☃" in text and "\\u" not in text
    assert text.endswith("}\n") and not text.endswith("\n\n")


def test_canonical_layout_matches_the_cpp_runtime() -> None:
    d = doc_of(S.toy_mlp())
    assert sorted(d) == ["domain", "inputs", "ir_version", "metadata", "name", "nodes", "outputs", "producer",
                         "tensors"]
    assert d["ir_version"] == {"major": 1, "minor": 0}
    assert d["tensors"][1] == {"id": 2, "name": "w1", "dtype": "f32", "quant_format": "f32", "shape": [4, 8],
                               "storage_hint": "external", "is_weight": True, "weight_ref": "weights/w1.bin"}
    assert d["nodes"][3] == {"id": 4, "name": "prob", "op_name": "Softmax", "op_version": "1", "inputs": [6],
                             "outputs": [7], "attributes": [{"key": "axis", "type": "int", "value": -1}]}
    assert d["inputs"] == [1] and d["outputs"] == [7]


def test_extensions_symbolic_dims_block_dtypes_constants_omitted_inputs() -> None:
    d = doc_of(S.rich_graph())
    t = {x["name"]: x for x in d["tensors"]}
    assert t["tokens"]["shape"] == ["batch", "seq"]
    assert t["emb"]["dtype"] == t["emb"]["quant_format"] == "q4_k"
    assert t["up"]["weight_ref"] == "m.gguf#ffn_up_exps#e=3"
    assert t["shape"]["data"] == "//////////8gAAAAAAAAAA=="
    assert "data" not in t["tokens"]
    assert d["nodes"][2]["inputs"] == [6, 0, 7] and d["nodes"][2]["outputs"] == [0]


@pytest.mark.parametrize("bits, text", [
    (0x7FF0000000000000, "inf"), (0xFFF0000000000000, "-inf"), (0x7FF8000000000000, "nan"),
    (0xFFF8000000000000, "nan:0xfff8000000000000"), (0x7FF0000000000001, "nan:0x7ff0000000000001")])
def test_non_finite_floats_are_spelled_exactly(bits: int, text: str) -> None:
    x = float_from_bits(bits)
    assert float_text(x) == text
    back = parse_float_text(text)
    assert back is not None and struct.pack("<d", back) == struct.pack("<d", x)


def test_finite_floats_keep_their_bits() -> None:
    values = (-0.0, 5e-324, 2.2250738585072014e-308, 0.1, 1e-05, 1.7976931348623157e308, 1 / 3)
    g = Graph("f", (), (), (Node("n", "Op", (), (), {"v": values}),), ())
    back = loads_json(dumps_json(g)).nodes[0].get("v")
    assert [struct.pack("<d", x) for x in back] == [struct.pack("<d", x) for x in values]


def test_empty_inline_constant_differs_from_none() -> None:
    g = Graph("c", (), (), (), (Tensor("e", DType.F32, (0,), data=b""), Tensor("n", DType.F32, (0,))))
    d = doc_of(g)
    assert d["tensors"][0]["data"] == "" and "data" not in d["tensors"][1]
    assert loads_json(dumps_json(g)) == g


# --- reading what the C++ runtime writes -------------------------------------------------------------------
def test_reads_cpp_spellings() -> None:
    g = S.toy_mlp()
    for first_id in (1, 100):
        assert S.graph_key(loads_json(S.cpp_style_json(g, first_id=first_id))) == S.graph_key(g)
    d = doc_of(g)
    d["tensors"][0]["storage_hint"] = "unspecified"
    del d["tensors"][0]["quant_format"]
    d["nodes"][0]["op_version"] = 1
    assert loads_json(json.dumps(d)).tensors[0].storage_hint is StorageHint.UNSPECIFIED
    d["tensors"][0]["quant_format"] = "Q4_K"
    assert "disagrees with dtype" in str(error_of(json.dumps(d)))


def test_lenient_but_exact_number_spellings() -> None:
    d = doc_of(Graph("f", (), (), (Node("n", "Op", (), (), {"v": 1.0}),), ()))
    d["nodes"][0]["attributes"][0]["value"] = 1
    assert loads_json(json.dumps(d)).nodes[0].get("v") == 1.0
    text = json.dumps(d).replace('"value": 1', '"value": NaN')
    assert math.isnan(loads_json(text).nodes[0].get("v"))


# --- errors ------------------------------------------------------------------------------------------------
def test_syntax_error_reports_byte_offset() -> None:
    text = '{"name": "ü", "x": ]}'
    e = error_of(text)
    assert e.offset == len('{"name": "ü", "x": '.encode())
    assert "invalid JSON" in str(e) and "m.uaii.json" in str(e)


@pytest.mark.parametrize("mutate, where, message", [
    (lambda d: d["nodes"][1]["inputs"].__setitem__(0, 99), "$.nodes[1].inputs[0]",
     "tensor id 99 is not declared"),
    (lambda d: d["outputs"].append(42), "$.outputs[1]", "tensor id 42"),
    (lambda d: d["tensors"][2].__setitem__("id", 1), "$.tensors[2].id", "declared twice"),
    (lambda d: d["tensors"][0].__setitem__("shape", [1, -4]), "$.tensors[0].shape[1]", "out of range"),
    (lambda d: d["tensors"][0].__setitem__("shape", [1, "no way"]), "$.tensors[0].shape[1]", "identifier"),
    (lambda d: d["tensors"][0].__setitem__("dtype", "f128"), "$.tensors[0].dtype", "unknown dtype"),
    (lambda d: d["tensors"][1].__setitem__("weight_ref", "a#b#e=x"), "$.tensors[1].weight_ref", "expert"),
    (lambda d: d["tensors"][0].pop("name"), "$.tensors[0]", "missing key 'name'"),
    (lambda d: d["tensors"][0].__setitem__("colour", 1), "$.tensors[0].colour", "unknown key"),
    (lambda d: d["nodes"][3]["attributes"][0].__setitem__("value", 1.5), "$.nodes[3].attributes[0].value",
     "expected an int"),
    (lambda d: d["nodes"][3]["attributes"][0].__setitem__("value", 1 << 63), "$.nodes[3].attributes[0].value",
     "out of range"),
    (lambda d: d["nodes"][3]["attributes"][0].__setitem__("type", "tensor"), "$.nodes[3].attributes[0].type",
     "unknown attribute type"),
    (lambda d: d["nodes"][0].__setitem__("op_version", "v1"), "$.nodes[0].op_version", "decimal string"),
    (lambda d: d["metadata"].__setitem__("k", 3), "$.metadata.k", "expected a string"),
    (lambda d: d["ir_version"].__setitem__("major", 2), "$.ir_version.major", "not supported"),
    (lambda d: d.__setitem__("tensors", {}), "$.tensors", "expected an array"),
])
def test_schema_errors_name_path_and_offset(mutate: Any, where: str, message: str) -> None:
    d = doc_of(S.toy_mlp())
    mutate(d)
    text = json.dumps(d, indent=1)
    e = error_of(text)
    assert where in str(e) and message in str(e)
    assert 0 <= (e.offset or 0) <= len(text.encode())


def test_error_offset_points_at_the_offending_value() -> None:
    d = doc_of(S.toy_mlp())
    d["nodes"][1]["inputs"] = [12345]
    text = json.dumps(d, indent=2)
    e = error_of(text)
    assert text.encode()[e.offset:].startswith(b"12345")


def test_duplicate_keys_are_rejected() -> None:
    text = dumps_json(S.toy_mlp()).replace('"name": "toy_mlp",', '"name": "toy_mlp", "name": "again",')
    assert "appears twice" in str(error_of(text))


def test_inline_data_must_be_canonical_base64_of_the_right_size() -> None:
    d = doc_of(S.rich_graph())
    t = next(x for x in d["tensors"] if "data" in x)
    for bad, msg in (("!!!!", "not valid base64"), ("//////////8gAAAAAAAAAB==", "not canonical"),
                     ("AAAA", "inline data has 3 bytes")):
        t["data"] = bad
        assert msg in str(error_of(json.dumps(d)))


@pytest.mark.parametrize("text, message", [
    (b"\xff{}", "invalid UTF-8"), ("[" * 100_000, "nesting too deep"),
    ('{"a": ' + "9" * 5000 + "}", "invalid JSON"),
    ("\ufeff{}", "invalid JSON"), ("", "invalid JSON"), ("[]", "expected an object"),
    ('{"name": "\\ud800"}', "missing key"),
])
def test_malformed_text(text: str | bytes, message: str) -> None:
    assert message in str(error_of(text))


def test_lone_surrogate_strings_are_rejected() -> None:
    text = dumps_json(S.toy_mlp()).replace('"toy_mlp"', '"\\udc00"')
    assert "$.name" in str(error_of(text))


# --- what a file cannot hold ------------------------------------------------------------------------------
@pytest.mark.parametrize("graph, message", [
    (Graph("g", ("nope",), (), (), ()), "no tensor declares"),
    (Graph("g", (), (), (Node("n", "Op", ("x",), ()),), ()), "no tensor declares"),
    (Graph("g", (), (), (), (Tensor("", DType.F32, ()),)), "empty name"),
    (Graph("g", (), (), (), (Tensor("t", DType.F32, (1 << 63,)),)), "64-bit"),
    (Graph("g", (), (), (), (Tensor("\ud800", DType.F32, ()),)), "not valid Unicode"),
    (Graph("g", (), (), (), (), metadata=(("k", "a"), ("k", "b"))), "duplicate metadata"),
    (Graph("g", (), (), (Node("n", "Op", (), (), version=-1),), ()), "op version"),
    (Graph("g", (), (), (), (), ir_version=(1, 1 << 32)), "u32"),
])
def test_unrepresentable_graphs_raise_graph_error(graph: Graph, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        dumps_json(graph)
