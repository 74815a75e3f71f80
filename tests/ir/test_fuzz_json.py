"""Fuzz the .uaii.json reader: mutated and truncated documents raise FormatError (with an offset) and
nothing else, each case within a time bound. `UAII_FUZZ_CASES=N` and `UAII_FUZZ_SEED` change the run."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
import serialize_support as S

from uaii.ir import FormatError
from uaii.ir.serialize import dumps_json, loads_json

SEEDS = [dumps_json(S.toy_mlp()).encode(), dumps_json(S.rich_graph()).encode(),
         S.cpp_style_json(S.toy_mlp(), first_id=40).encode()]
DOCS = [json.loads(s) for s in SEEDS]


def mutate(seed: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return S.mutate_json_text(seed, rng)  # type: ignore[no-any-return]
    doc: Any = copy.deepcopy(DOCS[SEEDS.index(seed)])
    for _ in range(rng.randint(1, 2)):
        doc = S.mutate_json_doc(doc, rng)
    return json.dumps(doc, indent=rng.choice([None, 1])).encode()


def test_fuzz_json() -> None:
    stats = S.run_fuzz("json", SEEDS, mutate, loads_json)
    assert stats["rejected"] > stats["cases"] // 2


@pytest.mark.parametrize("index", range(len(SEEDS)))
def test_every_truncation_fails_with_an_offset(index: int) -> None:
    seed = SEEDS[index]
    for n in range(len(seed.rstrip())):
        with pytest.raises(FormatError) as e:
            loads_json(seed[:n])
        assert e.value.offset is not None and e.value.offset <= n
