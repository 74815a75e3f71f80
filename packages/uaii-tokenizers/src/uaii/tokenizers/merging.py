"""The merge loop shared by llama.cpp's SentencePiece and BPE tokenizers (``llm_tokenizer_{spm,bpe}_session``).

Both split a text into UTF-8 characters (a lead byte gives the length, a stray continuation byte is one character),
queue every adjacent pair that may merge, and repeatedly merge the best pair (the lowest key; the leftmost on ties),
queueing the merged symbol's new pairs, until none is left. A queued pair whose symbols changed since is stale and
skipped; since symbols are contiguous and only grow, comparing the pair's byte length with the current sum of its
symbols' lengths is the same test as llama.cpp's. What differs is the key: minus the score of the merged piece
(SentencePiece), the rank of the merge rule (BPE).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

_UTF8_LEN = bytes([1] * 12 + [2, 2, 3, 4])   # by the high nibble of a lead byte, as llama.cpp's unicode_len_utf8

PairKey = Callable[[bytes, int], "float | None"]
"""(the two symbols' bytes, the length of the left one) -> merge priority, lower first; None: they never merge."""


def merge(data: bytes, key: PairKey) -> list[bytes]:
    """The symbols of `data` once no adjacent pair merges any more, in order."""
    start: list[int] = []
    size: list[int] = []
    pos, end = 0, len(data)
    while pos < end:
        n = min(_UTF8_LEN[data[pos] >> 4], end - pos)
        start.append(pos)
        size.append(n)
        pos += n
    count = len(start)
    if count < 2:
        return [data] if data else []
    prev = list(range(-1, count - 1))
    nxt = [*range(1, count), -1]
    queue: list[tuple[float, int, int, int]] = []

    def push(left: int, right: int) -> None:
        if left >= 0 and right >= 0:
            a, n = start[left], size[left] + size[right]
            k = key(data[a:a + n], size[left])
            if k is not None:
                heapq.heappush(queue, (k, left, right, n))

    for i in range(1, count):
        push(i - 1, i)
    while queue:
        _, left, right, n = heapq.heappop(queue)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != n:
            continue
        size[left] = n
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    out = []
    i = 0
    while i != -1:
        out.append(data[start[i]:start[i] + size[i]])
        i = nxt[i]
    return out
