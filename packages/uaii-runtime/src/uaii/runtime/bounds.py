"""The context rule of a Session: how many positions a sequence may use, and what happens at the end of them.

One rule, the same for every preset and window:

* the **context** is ``max_context``, else the model's context length, and never more than the positions the model
  was trained on (``trained``: the config's context length, and for learned positions no more than the rows of
  the position table). Past it RoPE extrapolates and learned positions do not exist (GPT-2 failed with a kernel
  status);
* with absolute positions (the default) a sequence ends at the context: a prompt longer than it is refused before
  anything runs, generation stops there with finish reason "length". A ``kv_window`` does not change that: it
  bounds memory, not the positions the model sees;
* with ``kv_positions="cache"`` and a window, rotary positions are cache slots, which stay below the window, so the
  sequence may go on past the context (StreamingLLM); it says so once, and a prompt longer than the context is
  windowed with a warning. The window plus sinks is cut to the context so that slots never pass it either. Only
  models with RoPE qualify (the KV state refuses others).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from uaii.runtime.errors import SessionError
from uaii.runtime.model import ModelBundle
from uaii.runtime.options import SessionOptions

log = logging.getLogger("uaii.runtime")
DEFAULT_CONTEXT = 4096  # when neither the options nor the model say


@dataclass
class ContextBounds:
    """The context of one session and the checks of the rule above (see the module docstring)."""

    name: str  # the model file, for messages
    context: int  # tokens a sequence may hold
    trained: int  # positions the model was trained on (0: unknown)
    rope: bool  # rotary positions (a RoPE node in the graph)
    slides: bool  # positions are cache slots of a window: the sequence may pass the context
    window: int
    sinks: int
    capped_by_option: bool  # max_context is below what the model has
    _noted: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, bundle: ModelBundle, options: SessionOptions) -> tuple[ContextBounds, SessionOptions]:
        """The bounds of ``bundle`` under ``options``, and the options with the window cut to the context where
        positions are cache slots."""
        name, trained = bundle.path.name, trained_context(bundle)
        o = options
        context = o.max_context or trained or DEFAULT_CONTEXT
        if o.max_context and trained and o.max_context > trained:
            log.warning("[runtime] max_context=%d is more than the %d positions %s was trained on; the context is %d",
                        o.max_context, trained, name, trained)
            context = trained
        if bundle.generative and o.kv_positions == "cache" and o.kv_window and o.kv_window + o.kv_sinks > context:
            window = context - o.kv_sinks
            if window < 1:
                raise SessionError(f"[runtime] kv_sinks={o.kv_sinks} leaves no room for a window in a context of "
                                   f"{context} tokens ({name})")
            log.info("[runtime] kv_window=%d + %d sinks is more than the context of %d tokens; with "
                     "kv_positions='cache' the window is %d", o.kv_window, o.kv_sinks, context, window)
            o = replace(o, kv_window=window)
        rope = any(node.op == "RoPE" for node in bundle.graph.nodes)
        slides = o.kv_positions == "cache" and bool(o.kv_window)
        return cls(name, context, trained, rope, slides, o.kv_window, o.kv_sinks,
                   bool(o.max_context) and 0 < context < trained), o

    def fits(self, n: int, used: int = 0) -> bool:
        """Whether ``n`` more tokens after ``used`` may run: they fit the context, or the window slides over them
        (what :meth:`check` refuses otherwise; the chat loop asks before it sends a conversation)."""
        return used + n <= self.context or self.slides

    def check(self, n: int, used: int) -> None:
        """``n`` more tokens after ``used``: refused (SessionError naming both numbers and what to do) unless they
        :meth:`fits` them; when a sliding window takes them past the context, that is said."""
        if not self.fits(n, used):
            raise SessionError(f"[runtime] {n} tokens do not fit the context: it holds {self.context} tokens and "
                               f"{used} are used ({self.name}); {self._hint()}")
        if used + n <= self.context:
            return
        if n > self.context:
            log.warning("[runtime] %d new tokens are more than the context of %d (%s): the window slides over "
                        "them, so the model sees the %d sink tokens and the last %d", n, self.context, self.name,
                        self.sinks, self.window)
        else:
            self._note_slides()

    def _hint(self) -> str:
        """What to do about tokens that do not fit."""
        if self.capped_by_option:
            return f"raise max_context (the model has {self.trained} positions)"
        if self.rope:
            return "shorten the prompt, or slide a window over it with kv_window and kv_positions='cache'"
        return "shorten the prompt (the model's positions are learned: no window can extend them)"

    def full(self, length: int) -> bool:
        """Whether a sequence of ``length`` tokens must stop (finish reason "length"): at the context, unless the
        window slides. Said once when a window was set: it bounds memory, not positions."""
        if length < self.context:
            return False
        if self.slides:
            self._note_slides()
            return False
        if self.window:
            hint = " kv_positions='cache' lets a window slide past it" if self.rope else ""
            self._note_once("stopped", "[runtime] generation stopped at the context of %d tokens (%s): a kv_window "
                            "bounds memory, not the model's positions;%s", self.context, self.name, hint)
        return True

    def _note_slides(self) -> None:
        self._note_once("slides", "[runtime] the sequence passes the context of %d tokens (%s): with "
                        "kv_positions='cache' the window keeps positions below it and generation goes on "
                        "(StreamingLLM)", self.context, self.name)

    def _note_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.warning(msg, *args)


def trained_context(bundle: ModelBundle) -> int:
    """Positions the model was trained on (0: unknown): its config's context length, and for learned positions
    (an Embedding that looks up the ``positions`` input, as GPT-2's) no more than the rows of that table."""
    n = bundle.context_length
    if not bundle.generative:
        return n
    graph = bundle.graph
    for node in graph.nodes:
        if node.op in ("Embedding", "Gather") and node.inputs[:1] == ("positions",) and len(node.inputs) > 1:
            shape = graph.tensor(node.inputs[1]).shape
            if shape and isinstance(shape[0], int):
                n = min(n, shape[0]) if n else shape[0]
    return n


__all__ = ["DEFAULT_CONTEXT", "ContextBounds", "trained_context"]
