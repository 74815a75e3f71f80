"""Generation for the C API on top of ``uaii.runtime.Session``: parameters, the per-token callback, statistics.

Without a callback a generation is exactly ``Session.generate``. ``Session`` streams text pieces but reports no
token ids while it generates, so with ``on_token`` the adapter drives it one token per call
(``Session.generate(history, max_new_tokens=1)``): the session's KV cache keeps the common prefix, so each call
feeds only the token before, which is a decode step; end-of-turn tokens, stop tokens and the context limit are the
session's own rules, and stop strings are cut by the runtime's TextStream. With sampling, call i seeds its sampler
with ``seed + i`` (reproducible, though not the sequence one long seeded call draws).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from uaii.capi.options import FinishReason, GenerateConfig, GenerationStats

OnToken = Callable[[int, str], bool]  # (token, text piece) -> stop?

_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP, "eos": FinishReason.EOS}


def sampling_params(config: GenerateConfig, step: int = 0) -> Any:
    """The runtime's SamplingParams, or None for plain greedy decoding."""
    from uaii.runtime.sampling import SamplingParams

    greedy = config.temperature == 0.0 and config.repetition_penalty == 1.0
    if greedy:
        return None
    seed = None if config.seed < 0 else config.seed + step
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
    if on_token is None:
        result = session.generate(prompt, max_new_tokens=config.max_new_tokens, sampling=sampling_params(config),
                                  stop=config.stop_strings, stop_token_ids=config.stop_token_ids, add_special=False)
        return list(result.prompt_tokens) + list(result.tokens), stats_from(result, config.max_new_tokens)
    return _generate_streaming(session, prompt, config, on_token)


def _generate_streaming(session: Any, prompt: list[int], config: GenerateConfig,
                        on_token: OnToken) -> tuple[list[int], GenerationStats]:
    from uaii.runtime.generate import TextStream

    text = TextStream(session.tokenizer, config.stop_strings)
    out: list[int] = []
    finish = FinishReason.LENGTH
    first: Any = None
    t0 = time.perf_counter()
    t_first = t0
    while len(out) < config.max_new_tokens:
        if len(prompt) + len(out) >= session.context and not session.options.kv_window:
            finish = FinishReason.CONTEXT
            break
        result = session.generate(prompt + out, max_new_tokens=1, sampling=sampling_params(config, len(out)),
                                  stop_token_ids=config.stop_token_ids, add_special=False)
        if first is None:
            first, t_first = result, time.perf_counter()
        if not result.tokens:
            finish = _FINISH.get(result.finish_reason, FinishReason.STOP)
            break
        token = int(result.tokens[0])
        out.append(token)
        piece = text.push(token)
        if on_token(token, piece):
            finish = FinishReason.CALLBACK
            break
        if text.stopped:
            finish = FinishReason.STOP
            break
    tail = text.finish()
    if tail:
        on_token(-1, tail)  # what the decoder held back (a partial character, a possible stop-string start)
    return prompt + out, _streaming_stats(first, prompt, out, finish, t0, t_first)


def _streaming_stats(first: Any, prompt: list[int], out: list[int], finish: FinishReason, t0: float,
                     t_first: float) -> GenerationStats:
    end = time.perf_counter()
    stats = GenerationStats(finish_reason=finish, prompt_tokens=len(prompt), generated_tokens=len(out))
    if first is not None:
        s = first.stats
        stats.cached_prompt_tokens = int(s.cached_tokens)
        stats.ttft_seconds = t_first - t0
        stats.prefill_seconds = float(s.prefill_s)
        stats.prefill_tokens_per_second = float(s.prefill_tok_s)
        stats.bytes_read_per_token = float(s.bytes_read_per_token)
        stats.peak_rss_bytes = int(s.peak_rss_bytes)
        stats.load_seconds = float(s.load_s)
    stats.decode_seconds = end - t_first
    steps = max(len(out) - 1, 0)  # tokens after the first, as the runtime counts decode tok/s
    stats.decode_tokens_per_second = steps / stats.decode_seconds if steps and stats.decode_seconds > 0 else 0.0
    stats.bytes_read = int(stats.bytes_read_per_token * len(out))
    return stats
