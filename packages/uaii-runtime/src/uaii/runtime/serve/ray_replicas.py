"""``uaii serve --ray``: the same OpenAI-compatible app, served by N replicas that Ray Serve runs and routes to.

A replica is one Ray actor process. It builds the ServerState the plain server builds (its own Session, its own
memory budget) from a :class:`ReplicaSpec`, and serves :func:`create_app` of it — the same routes, API key, browser
guard, body limits and dashboard — through ``serve.ingress`` without an app: the late-bound form, whose
``__serve_build_asgi_app__`` returns the app once the constructor has loaded the model. One HTTP proxy, on the
head node (``proxy_location="HeadOnly"``: one address, as the plain server has), listens on --host/--port, sends
each request to the replica with fewer requests in flight, and forwards every ASGI message as the replica sends it:
an SSE stream reaches the client token by token, not buffered.

/metrics: a replica knows only its own counters, and a request reaches one replica. So every replica reports its
:func:`metrics.snapshot` to a :class:`MetricsBoard` actor (owned by the ``uaii serve`` process) every
``REPORT_PERIOD_S`` and before the last message of every response (a client that has read its reply is counted
by then); a scrape, whichever replica it reaches, reports its own figures first and renders the board's snapshots
of the live replicas with :func:`metrics.render_replicas`. A killed replica's actor name leaves Ray's named actors
at once, and its figures leave the sums with it.

A replica that dies takes its in-flight requests with it (its streams break off); the other replicas' requests go
on, and Serve starts a replacement. Ray is imported only inside functions: ``uaii serve`` without --ray never
needs it, and the CLI names the ``ray`` extra when it is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from uaii.ir import UaiiError
from uaii.runtime.presets import Preset
from uaii.runtime.ray_support import import_ray

from . import metrics
from .app import create_app
from .errors import ServeError
from .state import Limits, ServerState

log = logging.getLogger("uaii.serve")

RAY_EXTRA = "pip install 'uaii-runtime[serve,ray]'"
APP_NAME = "uaii"  # the Serve application (and its one deployment)
SERVE_NAMESPACE = "serve"  # where Ray Serve names its actors (the replicas: SERVE_REPLICA::app#deployment#id)
BOARD_NAMESPACE = "uaii"
REPLICA_HEADER = b"x-uaii-replica"  # on every response: which replica answered (the replica label of /metrics)
REPORT_PERIOD_S = 1.0  # a replica's figures on the board are at most this old between its responses
REPORT_TIMEOUT_S = 5.0  # a board that does not answer delays a response by at most this
CONTROL_SLOTS = 4  # requests a replica takes beyond its decode slots: /health, /metrics, /v1/models stay answered
GRACEFUL_SHUTDOWN_S = 5.0  # what in-flight requests get to finish when the app is deleted (as uvicorn's, plain)
CONSTRUCTOR_RETRIES = 3  # loading a model fails the same way every time: say so instead of retrying 20 times
ROUTER = "uaii.runtime.serve.ray_router:LeastBusyOfTwo"  # by path: only Ray's processes import it


@dataclass(frozen=True)
class Scaling:
    """How many replicas: ``replicas`` of them, or with ``autoscale`` (min, max) as many as Ray Serve's autoscaler
    decides from the requests in flight per replica (its queue length), aiming at one full decode batch each."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    # how long requests must queue before a replica is added, and over how long the queue is averaged: Ray
    # Serve's defaults (30 s each); a deployment that must react faster (a test) sets less, the look-back above
    # the replicas' 10 s metrics period
    upscale_delay_s: float = 30.0
    look_back_s: float = 30.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ServeError(f"replicas must be >= 1, found {self.replicas}")
        if self.autoscale is not None:
            lo, hi = self.autoscale
            if lo < 1 or hi < lo:
                raise ServeError(f"autoscale needs 1 <= MIN <= MAX, found {lo}:{hi}")

    @property
    def most(self) -> int:
        """The most replicas there can be (what the auto preset's memory is shared by)."""
        return self.autoscale[1] if self.autoscale is not None else self.replicas

    def deployment_options(self, max_sequences: int) -> dict[str, Any]:
        """``serve.deployment`` options: the replica count or autoscaling config, how many requests Ray sends one
        replica at once (its decode slots plus CONTROL_SLOTS; more wait in the proxy for the first free one), and
        the router that spreads them over every node's replicas (serve/ray_router.py)."""
        options: dict[str, Any] = {"max_ongoing_requests": max_sequences + CONTROL_SLOTS,
                                   "request_router_config": {"request_router_class": ROUTER}}
        if self.autoscale is None:
            options["num_replicas"] = self.replicas
        else:
            lo, hi = self.autoscale
            options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": lo,
                                             "target_ongoing_requests": max_sequences,
                                             "upscale_delay_s": self.upscale_delay_s,
                                             "look_back_period_s": self.look_back_s}
        return options


def share_preset(preset: Preset, options: dict[str, Any], replicas: int) -> tuple[Preset, dict[str, Any]]:
    """The ``auto`` preset for one of ``replicas`` replicas: its budget (a share of this machine's available
    memory) divided among them, as they may all land on this machine (a local cluster). Another preset, or
    ``--budget``, is per replica as given: each replica's process holds that much, wherever Ray places it."""
    if preset.name != "auto" or not preset.budget_bytes or replicas == 1:
        return preset, options
    shared = preset.with_budget(preset.budget_bytes // replicas)
    return shared, {**options, "budget_bytes": shared.budget_bytes}


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica builds its ServerState from (pickled to the replicas), and its share of the cluster:
    ``n_threads`` CPUs (Ray reserves them; the Session runs that many kernel threads) and its budget as Ray's
    ``memory`` resource, so that Ray never places more replicas on a node than their budgets fit."""

    model: str | None
    models_dir: str | None = None
    session_options: dict[str, Any] = field(default_factory=dict)
    preset: Preset | None = None
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    cors_origins: tuple[str, ...] = ()
    board: str = ""  # the MetricsBoard's actor name (in BOARD_NAMESPACE)

    @property
    def threads(self) -> int:
        return int(self.session_options.get("n_threads") or 1)

    def actor_options(self) -> dict[str, Any]:
        """Ray's options of one replica actor: its CPUs, its budget as ``memory``, and this process's ``UAII_*``
        knobs (the cache directory, the debug level: a replica on another node would otherwise not see them)."""
        budget = int(self.session_options.get("budget_bytes") or 0)
        env = {k: v for k, v in os.environ.items() if k.startswith("UAII_")}
        return {"num_cpus": self.threads, **({"memory": budget} if budget else {}),
                **({"runtime_env": {"env_vars": env}} if env else {})}

    def build_state(self) -> ServerState:
        options = {**self.session_options, "n_threads": self.threads}
        return ServerState(self.model, models_dir=self.models_dir, session_options=options, preset=self.preset,
                           api_key=self.api_key, limits=self.limits, cors_origins=self.cors_origins)


class MetricsBoard:
    """The latest figures of each replica, by its actor name (a Ray actor; see the module docstring). A report
    carries the replica's sequence number: one that arrives after a newer one (the periodic thread's, overtaken by
    a response's) is dropped, so the counters shown never go back."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[int, metrics.Snapshot]] = {}
        self._failures: list[str] = []

    def failed(self, message: str) -> None:
        """A replica could not start (its model did not load): what ``deploy`` says when Serve gives up."""
        self._failures.append(message)

    def failures(self) -> list[str]:
        return list(self._failures)

    def report(self, replica: str, seq: int, snapshot: metrics.Snapshot) -> None:
        if replica not in self._latest or self._latest[replica][0] < seq:
            self._latest[replica] = (seq, snapshot)

    def live(self) -> dict[str, metrics.Snapshot]:
        """Replica id (the last part of its actor name) -> figures, for the replicas whose actors are alive."""
        import ray

        alive = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == SERVE_NAMESPACE}
        for gone in set(self._latest) - alive:
            del self._latest[gone]
        return {name.rsplit("#", 1)[-1]: snap for name, (_, snap) in self._latest.items()}


class ReplicaApp:
    """One replica's ASGI app: ``create_app``'s, plus the ``x-uaii-replica`` header on every response and a report
    to the board before the last message of each one (see the module docstring)."""

    def __init__(self, app: ASGIApp, tag: str, report: Callable[[], Awaitable[None]]) -> None:
        self.app = app
        self.tag = tag.encode("ascii")
        self.report = report

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER, self.tag)]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                await self.report()
            await send(message)

        await self.app(scope, receive, tagged_send)


class Replica:
    """The deployment's class (wrapped by ``serve.ingress()`` in :func:`deploy`): one ServerState per replica,
    served by :class:`ReplicaApp`, reporting to the board."""

    def __init__(self, spec: ReplicaSpec) -> None:
        import ray

        self._stop = threading.Event()  # first: Serve calls __del__ after a constructor that failed, too
        self.name = str(ray.get_runtime_context().get_actor_name())  # SERVE_REPLICA::uaii#uaii#<id>
        self.tag = self.name.rsplit("#", 1)[-1]
        self.board = ray.get_actor(spec.board, namespace=BOARD_NAMESPACE)
        try:
            self.state = spec.build_state()
        except Exception as exc:  # Serve logs the traceback; the board keeps the one line deploy() reports
            self.board.failed.remote(str(exc) if isinstance(exc, UaiiError) else f"{type(exc).__name__}: {exc}")
            raise
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        self._submit()
        threading.Thread(target=self._report_periodically, name="uaii-metrics-report", daemon=True).start()

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return ReplicaApp(create_app(self.state, metrics_page=self.metrics_page), self.tag, self.report)

    def _submit(self) -> Any:
        """Send this replica's figures to the board now; the call's ObjectRef."""
        with self._seq_lock:  # a later number is a later snapshot (the board keeps the latest)
            seq, snap = next(self._seq), metrics.snapshot(self.state)
        return self.board.report.remote(self.name, seq, snap)

    async def report(self) -> None:
        """Report and wait until the board has it; a board that fails or is slow is logged, not the client's
        problem."""
        try:
            await asyncio.wait_for(self._submit(), REPORT_TIMEOUT_S)
        except Exception as exc:  # a dead or slow board must not fail a reply
            log.warning("[serve] replica %s could not report its metrics: %s", self.tag, exc)

    async def metrics_page(self, state: ServerState) -> str:
        """/metrics of the whole deployment: this replica's figures now, the others' as last reported."""
        await self.report()
        return metrics.render_replicas(await self.board.live.remote())

    def _report_periodically(self) -> None:
        while not self._stop.wait(REPORT_PERIOD_S):
            try:
                self._submit()
            except Exception as exc:  # the board is gone (uaii serve ended): the replica is about to be too
                log.warning("[serve] replica %s could not report its metrics: %s", self.tag, exc)

    def __del__(self) -> None:
        self._stop.set()


@dataclass
class Deployed:
    """A running deployment: its URL, and :meth:`close` to take it down (and what :func:`deploy` started)."""

    url: str
    spec: ReplicaSpec
    scaling: Scaling
    board: Any
    disconnect: bool  # deploy() connected to Ray (or started it): close() disconnects (a local one stops)
    head_is_local: bool

    def close(self) -> None:
        import ray
        from ray import serve

        try:
            serve.delete(APP_NAME)
        finally:
            ray.kill(self.board)
            if self.disconnect:
                ray.shutdown()


def deploy(spec: ReplicaSpec, scaling: Scaling, *, host: str, port: int, address: str | None = None,
           debug: bool = False) -> Deployed:
    """Start (or join, ``address``) a Ray cluster, start Serve's proxy on ``host:port`` on its head node, and run
    the app on ``scaling``'s replicas; returns once every replica serves. A process already connected to Ray
    (``ray.init`` done by the caller) deploys on that connection and leaves it open on close."""
    try:
        ray = import_ray()
        from ray import serve  # noqa: F401  (here: a missing Ray is this one error)
    except ImportError as exc:
        raise ServeError(f"replicas on Ray need the ray extra ({exc.name or 'ray'} is not installed): "
                         f"{RAY_EXTRA}") from None
    disconnect = not ray.is_initialized()
    if disconnect:
        level = logging.INFO if debug else logging.WARNING
        ray.init(address=address, logging_level=level, namespace=BOARD_NAMESPACE)
    try:
        return _run(spec, scaling, host, port, disconnect, debug)
    except BaseException:
        if disconnect:
            ray.shutdown()
        raise


def _run(spec: ReplicaSpec, scaling: Scaling, host: str, port: int, disconnect: bool, debug: bool) -> Deployed:
    import ray
    from ray import serve

    head_is_local = _head_is_local(ray)
    port = _proxy_port(serve, host, port, head_is_local)
    logs = {"log_level": "INFO" if debug else "WARNING", "enable_access_log": debug}  # as uvicorn's, plain
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port}, logging_config=logs)
    spec = replace(spec, board=f"uaii-metrics-{uuid.uuid4().hex[:12]}")
    board = ray.remote(MetricsBoard).options(name=spec.board, namespace=BOARD_NAMESPACE, num_cpus=0).remote()
    deployment = serve.deployment(serve.ingress()(Replica), name=APP_NAME, ray_actor_options=spec.actor_options(),
                                  graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
                                  max_constructor_retry_count=CONSTRUCTOR_RETRIES, logging_config=logs,
                                  **scaling.deployment_options(spec.limits.max_sequences))
    try:
        serve.run(deployment.bind(spec), name=APP_NAME, route_prefix="/")
    except BaseException as exc:  # a failure, or Ctrl-C while the replicas start
        failures = ray.get(board.failures.remote(), timeout=REPORT_TIMEOUT_S) if isinstance(exc, Exception) else []
        with contextlib.suppress(Exception):  # leave no half-deployed application behind on a shared cluster
            serve.delete(APP_NAME)
        ray.kill(board)
        if not isinstance(exc, Exception):
            raise
        why = f"a replica could not start: {failures[0]}" if failures else _tail(exc)
        raise ServeError(f"the Ray Serve deployment failed: {why}") from exc
    shown = f"[{host}]" if ":" in host else host
    return Deployed(f"http://{shown}:{port}", spec, scaling, board, disconnect, head_is_local)


def _head_is_local(ray: Any) -> bool:
    """Whether the head node (where the proxy listens) is this machine."""
    here = ray.util.get_node_ip_address()
    heads = [n for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
    return not heads or heads[0].get("NodeManagerAddress") == here


def _proxy_port(serve: Any, host: str, port: int, head_is_local: bool) -> int:
    """The port the proxy will listen on. Serve already running on the cluster keeps its proxy (Ray applies HTTP
    options only when it starts Serve): it must be the one asked for. Else, on this machine, the port must be free
    (a one-line error now instead of a proxy that never starts) and 0 picks a free one; on a remote head, 0 has
    no meaning here."""
    running = _running_proxy(serve)
    if running is not None:
        if running[0] != host or port not in (0, running[1]):
            raise ServeError(f"Ray Serve already runs on this cluster with its proxy on {running[0]}:{running[1]}; "
                             f"give --host {running[0]} --port {running[1]}, or stop it first (`serve shutdown`)")
        return running[1]
    if not head_is_local:
        if port == 0:
            raise ServeError("--port 0 with --ray needs the Ray head node to be this machine (the proxy listens "
                             "there); give a port")
        return port
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            return int(sock.getsockname()[1])
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _running_proxy(serve: Any) -> tuple[str, int] | None:
    """(host, port) of the proxy of a Serve already running on the cluster, None when none runs. Ray has no
    public call for it; the controller client's HTTP config is where ``serve.start`` itself compares them."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    config = client.http_config
    return str(config.host), int(config.port)


def _tail(exc: BaseException, limit: int = 12) -> str:
    """Why Serve failed when no replica said (the cluster's trouble, not a model's): the last ``limit`` lines of
    its error, the cause being at the end of Ray's tracebacks."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return "\n".join(lines[-limit:]) if lines else type(exc).__name__


__all__ = ["APP_NAME", "RAY_EXTRA", "REPLICA_HEADER", "Deployed", "MetricsBoard", "Replica", "ReplicaApp",
           "ReplicaSpec", "Scaling", "deploy", "share_preset"]
