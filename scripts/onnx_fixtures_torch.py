"""The exported half of the ONNX fixtures: tiny random transformers models through torch's two ONNX exporters, an
Optimum-style export with KV I/O, and onnxruntime-genai's int4 model builder.

Each ``build_*`` function writes one fixture's files into ``dest`` and returns a description for
``scripts/onnx_fixtures.py``, which runs onnxruntime on it and writes the references: the ``file`` of the model
(relative to ``dest``), its ``inputs``, the torch outputs on them (``expected``, to prove the export computes what
the model does before onnxruntime's outputs become the reference), and for causal models a torch function that
gives the last position's logits for any prefix (``torch_last_logits``: the greedy sequence is checked against it
at its full length, which catches shapes the tracer baked in).

Two things transformers 4.57 does that the exporters cannot take as they are, patched only while exporting:
- its attention masks are built with ``torch.vmap`` (and a dynamo-only getitem mode): the TorchScript tracer fails
  on both (``IndexError: unordered_map::at``), so the legacy exports use a broadcasting version of the same mask
  function (what Optimum does);
- Mixtral's MoE block loops over the experts that received tokens (``nonzero``), which torch.export refuses and the
  tracer would freeze to the experts of the trace inputs: both exports use a dense form of the same routing (every
  expert computed, weighted by its renormalised top-k softmax weight, 0 when not selected), which ONNX Runtime and
  torch agree on to f32 rounding.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

SEED = 1234
BATCH_EXPORT, SEQ_EXPORT, PAST_EXPORT = 2, 5, 3  # trace shapes: never the reference shapes (batch 1, the prompt)
PROMPT_TEXT = "hey onnx!"  # 7 tokens with BOS
VOCAB = 264  # 256 byte-level tokens + 4 merges + 4 specials (tokenizer below)
PAD_ID, BOS_ID, EOS_ID = 260, 261, 262
LEGACY_OPSET, DYNAMO_OPSET = 14, 18

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
    pad_token_id=PAD_ID, initializer_range=0.2)

# arch: (config class, model class, config kwargs). initializer_range 0.2 (10x transformers' default): logits that
# are not all near zero, so greedy decoding has margins and a wrong op moves the outputs visibly.
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _COMMON),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _COMMON),  # q/k/v biases
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {**_COMMON, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,  # < prompt + steps
                "layer_types": ["sliding_attention", "full_attention"],
                "tie_word_embeddings": False}),  # tied, a random gemma3 repeats its last token (sqrt(d)-scaled input)
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=BOS_ID,
                  eos_token_id=EOS_ID, initializer_range=0.2)),
    "bert": ("BertConfig", "BertModel",
             dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, type_vocab_size=2, pad_token_id=PAD_ID, initializer_range=0.2)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2}),
}
CAUSAL = frozenset(ARCHS) - {"bert"}


# --- tokenizer -----------------------------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, so that token id == byte value for the 256 byte tokens."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_tokenizer(dest: Path) -> list[int]:
    """A byte-level BPE tokenizer.json (+ tokenizer_config.json) whose vocabulary is the models' ``VOCAB``; returns
    the prompt's ids (BOS first, as the post-processor adds it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    merges = [("Ġ", "o"), ("n", "n"), ("Ġo", "nn"), ("t", "h")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>", "<|im_end|>"])
    assert (tok.token_to_id("<pad>"), tok.token_to_id("<s>"), tok.token_to_id("</s>")) == (PAD_ID, BOS_ID, EOS_ID)
    assert tok.get_vocab_size() == VOCAB
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS_ID)])
    tok.save(str(dest / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "model_max_length": 128,
              "chat_template": "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return list(tok.encode(PROMPT_TEXT).ids)


# --- models --------------------------------------------------------------------------------------------------------
def tiny_model(arch: str, **overrides: Any) -> Any:
    """A random model of ``arch`` (the same weights on every call: the seed is set first), eval mode, f32."""
    import torch
    import transformers

    cfg_name, model_name, kwargs = ARCHS[arch]
    torch.manual_seed(SEED)
    config = getattr(transformers, cfg_name)(**{**kwargs, **overrides})
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "sdpa"
    model = getattr(transformers, model_name)(config).eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # transformers zero-initialises biases: random ones, so a dropped bias shows
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return model


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Exporters and the builder print progress and deprecation warnings: keep them for an error message only."""
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield buf
        finally:
            logging.disable(logging.NOTSET)


@contextlib.contextmanager
def _traceable_masks() -> Iterator[None]:
    """transformers' mask functions evaluated by broadcasting instead of torch.vmap, for the TorchScript tracer."""
    from transformers import masking_utils

    def broadcast(mask_function: Callable[..., Any], bh_indices: bool = True) -> Callable[..., Any]:
        def run(b: Any, h: Any, q: Any, kv: Any) -> Any:
            if not bh_indices:
                return mask_function(None, None, q[:, None], kv[None, :]).expand(q.shape[0], kv.shape[0])
            mask = mask_function(b[:, None, None, None], h[None, :, None, None], q[None, None, :, None],
                                 kv[None, None, None, :])
            return mask.expand(b.shape[0], h.shape[0], q.shape[0], kv.shape[0])
        return run

    patches = {"_vmap_for_bhqkv": broadcast, "TransformGetItemToIndex": contextlib.nullcontext}
    saved = {name: getattr(masking_utils, name) for name in patches if hasattr(masking_utils, name)}
    for name, value in patches.items():
        setattr(masking_utils, name, value)
    try:
        yield
    finally:
        for name in patches:
            if name in saved:
                setattr(masking_utils, name, saved[name])
            else:
                delattr(masking_utils, name)


def _dense_moe_forward(self: Any, hidden_states: Any) -> tuple[Any, Any]:
    """MixtralSparseMoeBlock.forward without data-dependent control flow: every expert runs on every token and is
    weighted by its renormalised top-k routing weight (0 for experts outside the top k)."""
    import torch

    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)
    router_logits = self.gate(x)
    probs = torch.softmax(router_logits, dim=1, dtype=torch.float)
    top, _ = torch.topk(probs, self.top_k, dim=-1)
    kept = torch.where(probs >= top[:, -1:], probs, torch.zeros_like(probs))
    weights = (kept / kept.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = sum(expert(x) * weights[:, e:e + 1] for e, expert in enumerate(self.experts))
    return out.reshape(batch, seq, hidden), router_logits


@contextlib.contextmanager
def _exportable(arch: str, legacy: bool) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        if legacy:
            stack.enter_context(_traceable_masks())
        if arch == "mixtral":
            from transformers.models.mixtral import modeling_mixtral

            block = modeling_mixtral.MixtralSparseMoeBlock
            stack.callback(setattr, block, "forward", block.forward)
            setattr(block, "forward", _dense_moe_forward)  # noqa: B010 (a method replaced for the export only)
        yield


def _input_names(arch: str) -> list[str]:
    return ["input_ids", "attention_mask", "token_type_ids"] if arch == "bert" else ["input_ids", "attention_mask"]


def _output_names(arch: str) -> list[str]:
    return ["last_hidden_state", "pooler_output"] if arch == "bert" else ["logits"]


def _forward_module(model: Any, arch: str) -> Any:
    """The model as a module of named tensors returning a tuple (what both exporters want)."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    class Encoder(Forward):
        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:  # type: ignore[override]
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    return (Encoder() if arch == "bert" else Forward()).eval()


def _feeds(arch: str, prompt: list[int]) -> dict[str, np.ndarray]:
    """The reference inputs (batch 1). bert: random ids, the last position padding, two segments."""
    if arch != "bert":
        ids = np.asarray([prompt], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, 256, size=(1, 7), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.asarray([[1, 1, 1, 1, 1, 1, 0]], dtype=np.int64),
            "token_type_ids": np.asarray([[0, 0, 0, 1, 1, 1, 1]], dtype=np.int64)}


def _trace_args(arch: str) -> tuple[Any, ...]:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 256, (BATCH_EXPORT, SEQ_EXPORT), generator=gen)
    args = [ids, torch.ones_like(ids)]
    if arch == "bert":
        args.append(torch.zeros_like(ids))
    return tuple(args)


def _torch_outputs(model: Any, arch: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}, use_cache=False)
    if arch == "bert":
        return {"last_hidden_state": out.last_hidden_state.numpy(), "pooler_output": out.pooler_output.numpy()}
    return {"logits": out.logits.numpy()}


def _last_logits_fn(model: Any) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def last(ids: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
            return model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False).logits[0, -1].numpy()
    return last


def build_export(arch: str, exporter: str, dest: Path) -> dict[str, Any]:
    """``<arch>-dynamo`` / ``<arch>-legacy``: the model without KV I/O, batch and sequence dynamic."""
    import torch

    torch.set_num_threads(1)
    model = tiny_model(arch, use_cache=False)
    prompt = write_tokenizer(dest) if arch in CAUSAL else []
    feeds = _feeds(arch, prompt)
    names, outs = _input_names(arch), _output_names(arch)
    path = dest / "model.onnx"
    legacy = exporter == "legacy"
    kwargs: dict[str, Any] = {"input_names": names, "output_names": outs}
    if legacy:
        axes = {n: {0: "batch", 1: "sequence"} for n in names}
        axes.update({n: ({0: "batch", 1: "sequence"} if n != "pooler_output" else {0: "batch"}) for n in outs})
        kwargs.update(dynamo=False, opset_version=LEGACY_OPSET, dynamic_axes=axes)
    else:
        dims = {"batch": torch.export.Dim("batch"), "sequence": torch.export.Dim("sequence")}
        kwargs.update(dynamo=True, opset_version=DYNAMO_OPSET, verbose=False,
                      dynamic_shapes={n: {0: dims["batch"], 1: dims["sequence"]} for n in names})
    with _quiet() as log, _exportable(arch, legacy):
        try:
            torch.onnx.export(_forward_module(model, arch), _trace_args(arch), str(path), **kwargs)
        except Exception as exc:
            raise RuntimeError(f"{arch}-{exporter}: torch.onnx.export failed: {exc}\n{log.getvalue()[-4000:]}") from exc
    return {"file": "model.onnx", "kind": "causal" if arch in CAUSAL else "forward",
            "exporter": "torch-dynamo" if not legacy else "torch-legacy", "inputs": feeds,
            "expected": _torch_outputs(model, arch, feeds), "tokenizer": arch in CAUSAL,
            "prompt_text": PROMPT_TEXT if arch in CAUSAL else None,
            "torch_last_logits": _last_logits_fn(model) if arch in CAUSAL else None}


# --- Optimum-style KV I/O ------------------------------------------------------------------------------------------
def kv_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return past, [n.replace("past_key_values", "present") for n in past]


def build_kv_optimum(arch: str, dest: Path) -> dict[str, Any]:
    """``<arch>-kv-optimum``: Optimum's decoder layout — input_ids, attention_mask [batch, past + sequence],
    position_ids, past_key_values.N.key/value [batch, kv_heads, past, head_dim] in; logits, present.N.key/value out
    (legacy exporter, opset 14, the cache passed as tensors through a DynamicCache built inside)."""
    import torch
    from transformers import DynamicCache

    torch.set_num_threads(1)
    model = tiny_model(arch, use_cache=True)
    cfg = model.config
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    past_names, present_names = kv_names(layers)

    class WithCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
            cache = DynamicCache(config=self.model.config)
            layers: list[Any] = list(cache.layers)
            for layer, (k, v) in zip(layers, zip(past[0::2], past[1::2], strict=True), strict=True):
                # what DynamicLayer.lazy_initialization + update would set, without a cat onto an empty tensor
                layer.dtype, layer.device, layer.keys, layer.values = k.dtype, k.device, k, v
                layer.is_initialized = True
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            presents = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *presents)

    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 256, (BATCH_EXPORT, SEQ_EXPORT), generator=gen)
    total = PAST_EXPORT + SEQ_EXPORT
    args = (ids, torch.ones(BATCH_EXPORT, total, dtype=torch.int64),
            torch.arange(PAST_EXPORT, total).expand(BATCH_EXPORT, -1),
            *[torch.randn(BATCH_EXPORT, kv_heads, PAST_EXPORT, head_dim, generator=gen) for _ in past_names])
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"}}
    axes.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names})
    axes.update({n: {0: "batch_size", 2: "past_sequence_length + sequence_length"} for n in present_names})
    prompt = write_tokenizer(dest)
    with _quiet() as log, _exportable(arch, legacy=True):
        try:
            torch.onnx.export(WithCache().eval(), args, str(dest / "model.onnx"), dynamo=False,
                              opset_version=LEGACY_OPSET, input_names=["input_ids", "attention_mask", "position_ids",
                                                                       *past_names],
                              output_names=["logits", *present_names], dynamic_axes=axes)
        except Exception as exc:
            raise RuntimeError(f"{arch}-kv-optimum: torch.onnx.export failed: {exc}\n{log.getvalue()[-4000:]}") from exc
    ids_np = np.asarray([prompt], dtype=np.int64)
    feeds = {"input_ids": ids_np, "attention_mask": np.ones_like(ids_np),
             "position_ids": np.arange(ids_np.shape[1], dtype=np.int64)[None],
             **{n: np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32) for n in past_names}}
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids_np), use_cache=True)
    expected = {"logits": out.logits.numpy()}
    expected.update({n: t.numpy() for n, t in zip(
        present_names, [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)], strict=True)})
    return {"file": "model.onnx", "kind": "causal-kv", "exporter": "torch-legacy-optimum", "inputs": feeds,
            "expected": expected, "tokenizer": True, "prompt_text": PROMPT_TEXT,
            "torch_last_logits": _last_logits_fn(model),
            "kv": {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "past": past_names,
                   "present": present_names, "layout": ["batch", "kv_heads", "past", "head_dim"],
                   "position_ids": True}}


# --- onnxruntime-genai's model builder -----------------------------------------------------------------------------
# every transformers class onnxruntime-genai 0.18's builders/base.py imports by name
_BUILDER_IMPORTS = ("Gemma3ForConditionalGeneration", "Lfm2VlForConditionalGeneration",
                    "Mistral3ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                    "Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                    "Qwen3_5MoeForConditionalGeneration")


def _import_builder() -> Any:
    """onnxruntime-genai 0.18's builder, importable under transformers 4.57.

    Its builders/base.py imports classes that only exist in transformers 5 (Qwen3_5*, used there for isinstance
    checks of models we do not build): empty stand-ins are set for whichever is missing. Each is looked up in
    sys.modules afresh, because importing a lazy transformers attribute can replace the module object there.
    """
    import transformers  # noqa: F401  (into sys.modules)

    for name in _BUILDER_IMPORTS:
        try:
            getattr(sys.modules["transformers"], name)
        except (AttributeError, ImportError):
            setattr(sys.modules["transformers"], name, type(name, (), {}))
    from onnxruntime_genai.models import builder

    return builder


def build_genai(arch: str, dest: Path) -> dict[str, Any]:
    """``genai-<arch>-int4``: the builder's int4 CPU model (MatMulNBits, GroupQueryAttention,
    (Skip)SimplifiedLayerNormalization) from the tiny random model saved locally."""
    import torch

    torch.set_num_threads(1)
    model = tiny_model(arch, use_cache=True)
    with tempfile.TemporaryDirectory(prefix="uaii-genai-") as tmp:
        src, cache = Path(tmp) / "hf", Path(tmp) / "cache"
        model.save_pretrained(src)
        prompt = write_tokenizer(src)
        with _quiet() as log:
            try:
                builder = _import_builder()
                opts = builder.parse_extra_options(None, str(src), str(dest), "int4", "cpu", str(cache), [])
                config = opts["hf_details"]["hf_config"]
                # transformers 4.57 leaves rope_scaling None for plain RoPE; the builder (written for 5.x's
                # rope_parameters) iterates over it: give it the explicit default.
                if getattr(config, "rope_scaling", None) is None:
                    config.rope_scaling = {"rope_type": "default"}
                builder.create_model(None, str(src), str(dest), "int4", "cpu", str(cache), **opts)
            except Exception as exc:
                raise RuntimeError(f"genai-{arch}-int4: the model builder failed: {exc}\n"
                                   f"{log.getvalue()[-4000:]}") from exc
    cfg = model.config
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    past_names, present_names = kv_names(layers)
    ids = np.asarray([prompt], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             **{n: np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32) for n in past_names}}
    return {"file": "model.onnx", "kind": "causal-kv", "exporter": "onnxruntime-genai-builder", "inputs": feeds,
            "expected": None, "tokenizer": True, "prompt_text": PROMPT_TEXT, "torch_last_logits": None,
            "quantized": True,
            "kv": {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "past": past_names,
                   "present": present_names, "layout": ["batch", "kv_heads", "past", "head_dim"],
                   "position_ids": False}}
