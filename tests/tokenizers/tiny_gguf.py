"""Write tiny tokenizer-only GGUF files from a vocabulary description (shared by the tests and the golden script).

`scripts/gen_tokenizer_golden.py` writes these files, runs llama.cpp on them and stores the description with
llama.cpp's answers in tests/golden/tokenizers/tiny.json; test_tiny_gguf.py writes the same files again from that
description and compares. Only `gguf` and numpy are needed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np


def write_tiny_gguf(path: Path, spec: dict[str, Any]) -> Path:
    """spec: arch, model, tokens, token_type, and optionally pre, merges, scores, bos/eos/unk/sep/pad ids, flags."""
    arch = spec.get("arch", "llama")
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_context_length(128)          # the few hyper-parameters llama.cpp reads even with vocab_only
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    if arch == "bert":
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
    else:
        w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(spec["model"])
    if spec.get("pre") is not None:
        w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(spec["tokens"])
    w.add_token_types(spec["token_type"])
    if spec.get("scores") is not None:
        w.add_token_scores(np.asarray(spec["scores"], dtype=np.float32).tolist())
    if spec.get("merges") is not None:
        w.add_token_merges(spec["merges"])
    for name, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                      ("sep", w.add_sep_token_id), ("pad", w.add_pad_token_id)):
        if spec.get(f"{name}_id") is not None:
            add(spec[f"{name}_id"])
    for name, add in (("add_bos", w.add_add_bos_token), ("add_eos", w.add_add_eos_token),
                      ("add_space_prefix", w.add_add_space_prefix)):
        if spec.get(name) is not None:
            add(bool(spec[name]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
