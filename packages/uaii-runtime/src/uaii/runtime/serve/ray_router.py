"""The request router of ``uaii serve --ray``: power of two choices over every replica, wherever it runs.

Ray Serve's own router first offers a request to the replicas on the proxy's node, and looks at the others only
when those are full (``max_ongoing_requests`` in flight): cheap requests then skip a network hop. A replica here
decodes a batch on the CPUs Ray gave it, so that preference leaves the other nodes' replicas idle while one replica
holds every request. This router draws two replicas from all of them and sends the request to the one with fewer
requests in flight (Ray's queue-length cache, or a probe), FIFO, and backs off as Ray's does when every one is full.

Imported by Ray (the proxy and the deployment handles, by the path ray_replicas gives it), never by ``uaii serve``
itself: it is the one module here that imports Ray at the top.
"""

from __future__ import annotations

import random

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica


class LeastBusyOfTwo(FIFOMixin, RequestRouter):
    """See the module docstring."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # all full: wait before the next round
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]


__all__ = ["LeastBusyOfTwo"]
