"""``uaii serve --ray``: the serve app on Ray Serve replicas (serve/ray_replicas.py), on a local two-node Ray cluster
(``ray.cluster_utils.Cluster``, one CPU per node) with the real SmolLM2.

The cluster starts once for the module, and the real command deploys once on it (``uaii serve MODEL --ray
--address ADDR --replicas 2 --threads 1``, in a subprocess, as a user runs it); the tests then drive it over HTTP
and kill one replica with ``ray.kill``. What must hold: every greedy reply of 8 concurrent streaming clients equals
the reply of one in-process ServerState (compared token by token, by the tokens' bytes), and arrives as a stream;
/metrics sums the replicas; a client that leaves cancels its request on its replica; a killed replica breaks only
its own streams. Then, on the same cluster, a model that does not load fails the deploy with the replica's own
error. The flag checks, the scaling options, the shared auto budget and the rendering of several replicas'
figures are checked without a cluster. ~65 s on 2 cores, most of it starting the cluster and the replicas.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="the ray extra is not installed: pip install 'uaii-runtime[serve,ray]'")
httpx = pytest.importorskip("httpx")

from serve_support import serving, uaii_serve  # noqa: E402

from uaii.runtime.cli.app import build_parser, main  # noqa: E402
from uaii.runtime.cli.context import runtime_options  # noqa: E402
from uaii.runtime.presets import GiB, MiB, get_preset  # noqa: E402
from uaii.runtime.serve import ServerState, metrics  # noqa: E402
from uaii.runtime.serve.errors import ServeError  # noqa: E402
from uaii.runtime.serve.ray_replicas import (  # noqa: E402
    APP_NAME,
    CONTROL_SLOTS,
    ROUTER,
    ReplicaSpec,
    Scaling,
    deploy,
    share_preset,
)
from uaii.runtime.serve.state import Limits  # noqa: E402

CLIENTS = 8
TOKENS = 24  # the concurrent clients' replies
KILL_TOKENS = 160  # long enough that the killed replica's streams are still running when it dies
MAX_CONTEXT = 256
FLAGS = ("--threads", "1", "--budget", "512MiB", "--max-context", str(MAX_CONTEXT))
PROMPTS = ["The capital of France is", "One, two, three,", "def fibonacci(n):", "My favourite fruit is",
           "The quick brown fox", "In 1492, Columbus", "Water boils at", "The first rule of"]
NODE = {"num_cpus": 1, "object_store_memory": 80 * MiB}


def session_options(model: Path) -> dict[str, Any]:
    """The Session options `uaii serve MODEL FLAGS` gives every replica (the CLI's own parsing)."""
    args = build_parser().parse_args(["serve", str(model), *FLAGS])
    _, options = runtime_options(args)
    return {**options, "max_context": MAX_CONTEXT}


# ------------------------------------------------------------------------------------------------ clients
@dataclass
class Reply:
    """One streamed chat completion as a client saw it."""

    replica: str | None = None
    tokens: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each token's frame arrived
    done: bool = False  # the stream ended with [DONE]
    error: str | None = None  # an error frame, a status other than 200, or a broken connection
    first: threading.Event = field(default_factory=threading.Event)  # the first token arrived (or it failed)

    @property
    def complete(self) -> bool:
        return self.done and self.error is None


def chat_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "stream": stream}


def stream_chat(url: str, prompt: str, max_tokens: int, reply: Reply, start: threading.Barrier | None = None) -> None:
    try:
        if start is not None:
            start.wait(timeout=60)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=chat_body(prompt, max_tokens, True),
                          timeout=120) as r:
            reply.replica = r.headers.get("x-uaii-replica")
            if r.status_code != 200:
                reply.error = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                return
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    reply.done = True
                elif line.startswith("data: {"):
                    frame = json.loads(line[6:])
                    if "error" in frame:
                        reply.error = f"error frame: {frame['error']}"
                        continue
                    logprobs = frame["choices"][0].get("logprobs")
                    for item in (logprobs or {}).get("content") or ():
                        reply.tokens.append(bytes(item["bytes"]))
                        reply.times.append(time.perf_counter())
                        reply.first.set()
    except httpx.HTTPError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    finally:
        reply.first.set()


def concurrent_streams(url: str, max_tokens: int) -> tuple[dict[str, Reply], list[threading.Thread]]:
    """CLIENTS streams, one per prompt, started together (threads running; join them)."""
    replies = {p: Reply() for p in PROMPTS}
    start = threading.Barrier(len(PROMPTS))
    threads = [threading.Thread(target=stream_chat, args=(url, p, max_tokens, replies[p], start), daemon=True)
               for p in PROMPTS]
    for t in threads:
        t.start()
    return replies, threads


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def expected(smollm2_path: Path) -> dict[str, list[bytes]]:
    """Each prompt's greedy reply (KILL_TOKENS tokens) from one in-process ServerState, one request at a time."""
    state = ServerState(smollm2_path, session_options={**session_options(smollm2_path), "plan_cache": False})
    out = {}
    with serving(state) as url:
        for prompt in PROMPTS:
            reply = Reply()
            stream_chat(url, prompt, KILL_TOKENS, reply)
            assert reply.complete and len(reply.tokens) == KILL_TOKENS, reply
            out[prompt] = reply.tokens
    return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A two-node Ray cluster on this machine (one CPU each: one replica per node); this process is connected."""
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        nodes.add_node(**NODE)
        ray.init(address=nodes.address)
        yield nodes.address
    finally:
        ray.shutdown()
        nodes.shutdown()


@pytest.fixture(scope="class")
def served(cluster: str, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of ``uaii serve MODEL --ray --address CLUSTER --replicas 2 ...`` (the CLI, in a subprocess;
    its plan cache in a temp directory, which the replicas get through their UAII_* environment)."""
    cache = tmp_path_factory.mktemp("ray-cache")
    with uaii_serve(str(smollm2_path), "--ray", "--address", cluster, "--replicas", "2", *FLAGS,
                    env={"UAII_CACHE_DIR": str(cache)}) as proc:
        assert any(line.startswith("replicas: 2 on the Ray cluster at") for line in proc.stdout), proc.stdout
        # only the replicas plan (this process deploys): their UAII_* environment came with them
        assert list((cache / "plans").glob("*.json")), "the replicas did not plan into the CLI's UAII_CACHE_DIR"
        yield proc.url


# ------------------------------------------------------------------------------------------------ on the cluster
def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """/metrics as {(name, labels): value}."""
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            pairs = [p.split("=", 1) for p in labels.rstrip("}").split(",") if p]
            out[name, frozenset((k, v.strip('"')) for k, v in pairs)] = float(value)
    return out


class TestTwoReplicas:
    """One deployment of the real command (the class-scoped ``served``), driven over HTTP: the tests run in
    this order, the kill last."""

    def test_two_replicas_serve_eight_streams_as_one_process(self, expected: dict[str, list[bytes]],
                                                             served: str) -> None:
        replies, threads = concurrent_streams(served, TOKENS)
        for t in threads:
            t.join(timeout=180)
        for prompt, reply in replies.items():
            assert reply.complete, f"{prompt!r}: {reply.error or 'no [DONE]'}"
            assert reply.tokens == expected[prompt][:TOKENS], f"{prompt!r}: the replica's reply differs"
            # streamed, not buffered: the frames arrived over the decode, not all at once at its end
            assert reply.times[-1] - reply.times[0] > 0.05, f"{prompt!r}: all {TOKENS} frames arrived at once"
        served_by = {r.replica for r in replies.values()}
        assert len(served_by) == 2 and None not in served_by, f"not split over the 2 replicas: {served_by}"

    def test_metrics_sum_the_replicas(self, served: str) -> None:
        n, tokens = 6, 8
        before = scrape(served)
        tags: list[str | None] = [None] * n

        def ask(i: int) -> None:
            r = httpx.post(f"{served}/v1/chat/completions", json=chat_body(PROMPTS[i], tokens, False), timeout=120)
            assert r.status_code == 200, r.text
            tags[i] = r.headers["x-uaii-replica"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert None not in tags and len(set(tags)) == 2, f"the {n} requests were not split over both replicas: {tags}"
        after = scrape(served)

        def delta(name: str, **labels: str) -> float:
            key = (name, frozenset(labels.items()))
            return after.get(key, 0.0) - before.get(key, 0.0)

        chat = {"route": "/v1/chat/completions", "status": "200"}
        assert delta("uaii_http_requests_total", **chat) == n
        assert delta("uaii_requests_total") == n
        assert delta("uaii_completion_tokens_total") == n * tokens
        assert after["uaii_replicas", frozenset()] == 2
        assert after["uaii_model_loaded", frozenset({("model", "SmolLM2-135M-Instruct.Q4_1")})] == 2
        for tag in set(tags):  # each replica's own series counts what that replica answered
            assert delta("uaii_replica_http_requests_total", replica=str(tag), **chat) == tags.count(tag)
            assert delta("uaii_replica_completion_tokens_total", replica=str(tag)) == tags.count(tag) * tokens
        rss = [v for (name, _), v in after.items() if name == "uaii_replica_process_resident_memory_bytes"]
        assert len(rss) == 2 and after["uaii_process_resident_memory_bytes", frozenset()] == sum(rss)

    def test_a_client_that_leaves_cancels_its_request(self, served: str) -> None:
        """The proxy passes a disconnect on to the replica: its engine stops decoding that request at once."""
        before = scrape(served)
        with httpx.stream("POST", f"{served}/v1/chat/completions", json=chat_body(PROMPTS[0], KILL_TOKENS, True),
                          timeout=120) as r:
            frames = 0
            for line in r.iter_lines():
                frames += line.startswith("data: {")
                if frames == 3:
                    break  # leave mid-stream
        time.sleep(2.5)  # longer than the whole reply takes, and than REPORT_PERIOD_S
        after = scrape(served)
        key = ("uaii_completion_tokens_total", frozenset())
        tokens = after[key] - before[key]
        assert tokens < KILL_TOKENS / 2, f"{tokens:.0f} tokens decoded for a client that left after 3"
        assert after["uaii_sequences_active", frozenset()] == 0

    def test_a_killed_replica_fails_only_its_own_requests(self, expected: dict[str, list[bytes]], served: str) -> None:
        import ray

        replies, threads = concurrent_streams(served, KILL_TOKENS)
        for reply in replies.values():
            assert reply.first.wait(timeout=120)
        victim = next(iter(replies.values())).replica
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == "serve" and a["name"].endswith(f"#{victim}")]
        assert len(names) == 1, f"no replica actor named ...#{victim}: {names}"
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        for t in threads:
            t.join(timeout=180)
        lost = {p: r for p, r in replies.items() if r.replica == victim}
        kept = {p: r for p, r in replies.items() if r.replica != victim}
        assert lost and kept, {p: r.replica for p, r in replies.items()}
        for prompt, reply in lost.items():
            # cut mid-stream: no [DONE], and the client sees the broken connection
            assert not reply.done and reply.error and len(reply.tokens) < KILL_TOKENS, (prompt, reply.error)
        for prompt, reply in kept.items():
            assert reply.complete, f"{prompt!r} (on the replica that lives): {reply.error or 'no [DONE]'}"
            assert reply.tokens == expected[prompt], f"{prompt!r}: the surviving replica's reply differs"
        # the deployment goes on serving: the live replica (and the replacement Serve starts) answer
        for prompt in PROMPTS[:3]:
            r = httpx.post(f"{served}/v1/chat/completions", json=chat_body(prompt, TOKENS, False), timeout=120)
            assert r.status_code == 200, r.text
            got = [bytes(i["bytes"]) for i in r.json()["choices"][0]["logprobs"]["content"]]
            assert got == expected[prompt][:TOKENS]
            assert r.headers["x-uaii-replica"] != victim
        assert victim not in {dict(labels).get("replica") for _, labels in scrape(served)}


def test_a_replica_that_cannot_load_its_model_fails_the_deploy(cluster: str, tmp_path: Path) -> None:
    """After the class's deployment is gone (its CPUs free again): ``deploy`` in this process, on this connection,
    with a file that is not a model. Serve gives up after CONSTRUCTOR_RETRIES; the error is the replica's own."""
    from ray import serve

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model at all")
    spec = ReplicaSpec(model=str(bad), session_options={"n_threads": 1})
    with pytest.raises(ServeError, match=r"a replica could not start: .*broken.gguf: not a GGUF file"):
        deploy(spec, Scaling(1), host="127.0.0.1", port=0)
    assert "uaii" not in serve.status().applications  # nothing half-deployed is left


def test_autoscaling_adds_a_replica_while_requests_queue(cluster: str, smollm2_path: Path,
                                                        expected: dict[str, list[bytes]]) -> None:
    """--autoscale 1:2 with a one-sequence batch: streams kept queueing on the one replica (4 in flight, each
    replaced when it ends) until the autoscaler adds the second (its delays shortened from Ray's 30 s); every
    stream gets the reply one process gives."""
    from ray import serve

    spec = ReplicaSpec(model=str(smollm2_path), session_options=session_options(smollm2_path),
                       limits=Limits(max_sequences=1))
    deployed = deploy(spec, Scaling(autoscale=(1, 2), upscale_delay_s=1.0, look_back_s=12.0), host="127.0.0.1",
                      port=0)

    def running() -> int:
        status = serve.status().applications[APP_NAME].deployments[APP_NAME]
        return int(status.replica_states.get("RUNNING", 0))

    replies: list[tuple[str, Reply]] = []
    threads: list[threading.Thread] = []
    try:
        assert running() == 1
        deadline, most, n = time.monotonic() + 120, 1, 0
        while time.monotonic() < deadline and most < 2:
            while sum(t.is_alive() for t in threads) < 4:  # keep 4 in flight: a queue the autoscaler sees
                prompt = PROMPTS[n % len(PROMPTS)]
                reply = Reply()
                replies.append((prompt, reply))
                threads.append(threading.Thread(target=stream_chat, daemon=True,
                                                 args=(deployed.url, prompt, KILL_TOKENS, reply)))
                threads[-1].start()
                n += 1
            most = max(most, running())
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=240)
        assert most == 2, f"no second replica after {n} requests queued on a 1-sequence replica"
        for prompt, reply in replies:
            assert reply.complete and reply.tokens == expected[prompt], f"{prompt!r}: {reply.error}"
    finally:
        deployed.close()


# ------------------------------------------------------------------------------------------------ no cluster
@pytest.mark.parametrize(("flags", "said"), [
    (["--replicas", "2"], "--replicas needs --ray"),
    (["--address", "auto"], "--ray-address apply only with --pipeline K (--ray-address also with uaii serve --ray)"),
    (["--autoscale", "1:2"], "--autoscale needs --ray"),
    (["--ray", "--replicas", "0"], "--replicas must be >= 1, found 0"),
    (["--ray", "--replicas", "2", "--autoscale", "1:3"], "give --replicas N or --autoscale MIN:MAX, not both"),
    (["--ray", "--autoscale", "3"], "--autoscale expects MIN:MAX (two whole numbers, e.g. 1:4), found '3'"),
    (["--ray", "--autoscale", "a:b"], "--autoscale expects MIN:MAX"),
    (["--ray", "--autoscale", "2:1"], "--autoscale 2:1: needs 1 <= MIN <= MAX"),
    (["--ray", "--autoscale", "0:2"], "--autoscale 0:2: needs 1 <= MIN <= MAX"),
    (["--ray", "--pipeline", "2"], "--ray with --pipeline: replicas of a model split into stages are not supported"),
])
def test_replica_flags_are_checked(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "no-such-model.gguf", *flags]) == 1
    err = capsys.readouterr().err
    assert said in err and err.startswith("error: [cli]"), err


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray.serve", None)  # as if not installed
    assert main(["serve", "no-such-model.gguf", "--ray"]) == 1
    err = capsys.readouterr().err
    assert "uaii serve --ray needs the ray extra" in err and "pip install 'uaii-runtime[serve,ray]'" in err, err


def test_scaling_options() -> None:
    fixed = Scaling(3).deployment_options(8)
    assert fixed["num_replicas"] == 3 and fixed["max_ongoing_requests"] == 8 + CONTROL_SLOTS
    assert fixed["request_router_config"] == {"request_router_class": ROUTER}
    auto = Scaling(autoscale=(1, 4)).deployment_options(8)
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 8, "upscale_delay_s": 30.0,
                                          "look_back_period_s": 30.0}
    assert "num_replicas" not in auto and Scaling(autoscale=(1, 4)).most == 4
    with pytest.raises(Exception, match="replicas must be >= 1"):
        Scaling(0)
    with pytest.raises(Exception, match="1 <= MIN <= MAX"):
        Scaling(autoscale=(3, 2))


def test_the_auto_budget_is_shared_by_the_replicas() -> None:
    auto = get_preset("auto").with_budget(4 * GiB)
    preset, options = share_preset(auto, auto.session_options(), 4)
    assert preset.budget_bytes == options["budget_bytes"] == GiB
    laptop = get_preset("laptop")  # a fixed preset (or --budget) is each replica's as given
    assert share_preset(laptop, laptop.session_options(), 4)[0] is laptop


def test_render_replicas_sums_counters_and_labels_each_replica() -> None:
    def snap(requests: int, tokens: int, per_token: float, batched: bool, rss: int) -> metrics.Snapshot:
        return {"requests": {("/v1/chat/completions", 200): requests}, "models": {"m": 1}, "rss": rss,
                "stats": {"requests_total": requests, "completion_tokens_total": tokens, "requests_active": 1,
                          "bytes_read_per_token": per_token, "batched_decode": batched,
                          "batch_size_histogram": {1: requests, 2: 1}}}

    page = metrics.render_replicas({"a": snap(3, 30, 100.0, True, 1000), "b": snap(2, 20, 300.0, False, 500)})
    lines = set(page.splitlines())
    for line in ['uaii_http_requests_total{route="/v1/chat/completions",status="200"} 5.0',
                 "uaii_requests_total 5.0", "uaii_completion_tokens_total 50.0", "uaii_sequences_active 2.0",
                 "uaii_bytes_read_per_token 200.0", "uaii_batched_decode 0.0", 'uaii_model_loaded{model="m"} 2.0',
                 'uaii_decode_steps_total{batch_size="1"} 5.0', 'uaii_decode_steps_total{batch_size="2"} 2.0',
                 "uaii_process_resident_memory_bytes 1500.0", "uaii_replicas 2.0",
                 'uaii_replica_requests_total{replica="a"} 3.0', 'uaii_replica_requests_total{replica="b"} 2.0',
                 'uaii_replica_http_requests_total{replica="b",route="/v1/chat/completions",status="200"} 2.0',
                 'uaii_replica_batched_decode{replica="a"} 1.0']:
        assert line in lines, f"{line!r} not in the page:\n{page}"
    assert "# TYPE uaii_replica_completion_tokens_total counter" in lines
