"""Generation for the C API on top of ``uaii.runtime.Session``: parameters, the per-token callback, statistics.

A generation is exactly one ``Session.generate`` call; the C per-token callback rides on its ``on_token`` hook,
so a seeded sampled generation draws the same tokens with or without a callback. The text the runtime's
decoder held back at the end (a partial character, a possible stop-string start) reaches the callback last, with
token id -1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uaii.capi.options import FinishReason, GenerateConfig, GenerationStats

OnToken = Callable[[int, str], bool]  # (token, text piece) -> stop?

_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP, "eos": FinishReason.EOS}


def sampling_params(config: GenerateConfig) -> Any:
    """The runtime's SamplingParams, or None for plain greedy decoding."""
    from uaii.runtime import SamplingParams

    greedy = config.temperature == 0.0 and config.repetition_penalty == 1.0
    if greedy:
        return None
    seed = None if config.seed < 0 else config.seed
    return SamplingParams(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                          min_p=config.min_p, repetition_penalty=config.repetition_penalty, seed=seed)


def finish_reason(reason: str, new_tokens: int, max_new_tokens: int) -> FinishReason:
    if reason == "length" and new_tokens < max_new_tokens:
        return FinishReason.CONTEXT
    return _FINISH.get(reason, FinishReason.NONE)


def stats_from(result: Any, max_new_tokens: int) -> GenerationStats:
    """The C stats of a runtime GenerationResult."""
    s = result.stats
    new = int(s.new_tokens)
    per_token = float(s.bytes_read_per_token)
    return GenerationStats(
        finish_reason=finish_reason(result.finish_reason, new, max_new_tokens), prompt_tokens=int(s.prompt_tokens),
        generated_tokens=new, cached_prompt_tokens=int(s.cached_tokens), ttft_seconds=float(s.ttft_s),
        prefill_seconds=float(s.prefill_s), decode_seconds=float(s.decode_s),
        prefill_tokens_per_second=float(s.prefill_tok_s), decode_tokens_per_second=float(s.decode_tok_s),
        bytes_read=int(per_token * new), bytes_read_per_token=per_token, peak_rss_bytes=int(s.peak_rss_bytes),
        load_seconds=float(s.load_s))


def generate(session: Any, prompt: list[int], config: GenerateConfig,
             on_token: OnToken | None = None) -> tuple[list[int], GenerationStats]:
    """(prompt + new tokens, stats) of one generation."""
    delivered: list[str] = []
    by_callback = False

    def forward(token: int, piece: str) -> bool:
        nonlocal by_callback
        delivered.append(piece)
        by_callback = bool(on_token(token, piece)) if on_token is not None else False
        return by_callback

    result = session.generate(prompt, max_new_tokens=config.max_new_tokens, sampling=sampling_params(config),
                              stop=config.stop_strings, stop_token_ids=config.stop_token_ids, add_special=False,
                              on_token=forward if on_token is not None else None)
    if on_token is not None:
        sent = "".join(delivered)
        if len(result.text) > len(sent) and result.text.startswith(sent):
            on_token(-1, result.text[len(sent):])
    stats = stats_from(result, config.max_new_tokens)
    if by_callback:
        stats.finish_reason = FinishReason.CALLBACK
    return list(result.prompt_tokens) + list(result.tokens), stats
