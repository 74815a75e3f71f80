"""The dashboard's JSON API (uaii.runtime.serve.dashboard) on the real SmolLM2: models with their memory estimate
before loading, the what-if plan at several budgets (the same figures a Session plans), telemetry of a loaded
model, devices, bench, load/unload, and the refusals (unknown model 404, bad budget 400, missing key 401)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import serving  # noqa: E402  (skips the module without the serve extra)

from uaii.ir.plan import WeightPlacement  # noqa: E402
from uaii.runtime.presets import MiB  # noqa: E402
from uaii.runtime.serve import ServerState  # noqa: E402
from uaii.runtime.serve.dashboard import measure_read  # noqa: E402
from uaii.runtime.serve.plan_view import weight_groups  # noqa: E402

BUDGET = 64 * MiB  # SmolLM2's weights are 92 MiB: under this budget some layers stream
OPTIONS: dict[str, Any] = {"preset": "auto", "budget_bytes": BUDGET, "max_context": 256, "kv_window": 0}


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerState]]:
    """One server over SmolLM2, nothing loaded at start; plans go to a temporary plan cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UAII_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        state = ServerState(model=smollm2_path, preload=False, session_options=dict(OPTIONS))
        with serving(state) as url:
            yield url, state


def name_of(path: Path) -> str:
    return path.name.removesuffix(".gguf")


def get(url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, timeout=120)


def plan(url: str, model: str, budget: str) -> dict[str, Any]:
    r = get(url, "/api/plan", model=model, budget=budget)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def split(view: dict[str, Any]) -> dict[str, int]:
    groups = view["layers"] + view["others"]
    return {mode: sum(g[mode] for g in groups) for mode in ("pinned", "streamed", "mmap")}


def test_the_page_and_its_files_are_served(server: tuple[str, ServerState]) -> None:
    url, _ = server
    page = get(url, "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/app.js"' in page.text and 'href="/static/style.css"' in page.text
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        r = get(url, f"/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"], name
    assert get(url, "/static/missing.js").status_code == 404


def test_models_table_has_the_quant_mix_and_the_plan_before_loading(server: tuple[str, ServerState],
                                                                    smollm2_path: Path) -> None:
    from uaii.loaders import load_model
    from uaii.runtime.cli.inspection import describe

    url, state = server
    state.unload()
    data = get(url, "/api/models").json()
    assert data["budget_bytes"] == BUDGET and data["loaded"] is None
    (row,) = data["models"]
    facts = describe(load_model(smollm2_path))  # what `uaii inspect --json` says of the file
    assert row["name"] == name_of(smollm2_path) and row["size_bytes"] == smollm2_path.stat().st_size
    assert row["architecture"] == facts["architecture"] == "llama" and not row["loaded"]
    assert row["quant_mix"] == {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in facts["quant_mix"].items()}
    est = row["estimate"]
    assert est["fits"] and est["budget_bytes"] == BUDGET and est["total_bytes"] <= BUDGET
    assert sum(est["parts"].values()) == est["total_bytes"]
    assert est["parts"]["kv_cache"] > 0 and est["parts"]["arena"] > 0 and est["streamed_bytes_per_token"] > 0
    assert state.loaded is None  # estimating loaded nothing


def test_plan_changes_with_the_budget_without_loading(server: tuple[str, ServerState], smollm2_path: Path) -> None:
    url, state = server
    name = name_of(smollm2_path)
    tight, roomy, unlimited = (plan(url, name, b) for b in ("40MiB", "80MiB", "0"))
    for view in (tight, roomy, unlimited):
        assert [g["group"] for g in view["layers"]] == [f"blk.{i}" for i in range(30)]  # the model's 30 blocks
        assert view["fits"] and view["model"] == name
    weights = sum(g["bytes"] for g in tight["layers"] + tight["others"])
    for view in (tight, roomy):
        assert view["total_bytes"] <= view["budget_bytes"] and split(view)["mmap"] == 0
        assert split(view)["pinned"] + split(view)["streamed"] == weights
    assert split(tight)["pinned"] < split(roomy)["pinned"] and split(tight)["streamed"] > split(roomy)["streamed"]
    assert any(g["streamed"] for g in tight["layers"]) and any(g["mode"] != "pinned" for g in tight["layers"])
    assert split(unlimited) == {"pinned": 0, "streamed": 0, "mmap": weights}
    assert {g["mode"] for g in unlimited["layers"]} == {"mmap"} and unlimited["parts"]["staging"] == 0
    lo, hi = tight["range"]["min_bytes"], tight["range"]["max_bytes"]
    assert 0 < lo < 40 * MiB < 80 * MiB < hi
    assert state.loaded is None


def test_plan_is_what_a_session_plans(server: tuple[str, ServerState], smollm2_path: Path) -> None:
    """The picture shows the plan a Session with the server's options makes (summarize, as `uaii plan` prints)."""
    from uaii.planner import summarize
    from uaii.runtime import Session

    url, _ = server
    view = plan(url, name_of(smollm2_path), "48MiB")
    with Session(smollm2_path, **{**OPTIONS, "budget_bytes": 48 * MiB}) as session:
        summary = summarize(session.plan)
    assert view["total_bytes"] == summary["total_bytes"]
    assert view["parts"]["pinned"] == summary["pinned_bytes"]
    assert view["streamed_bytes_per_token"] == summary["streamed_bytes_per_token"]
    modes = {g["group"]: g["mode"] for g in summary["groups"]}
    assert {g["group"]: g["mode"] for g in view["layers"] + view["others"]} == modes


def test_a_budget_below_the_smallest_plan_is_shown_not_refused(server: tuple[str, ServerState],
                                                               smollm2_path: Path) -> None:
    url, _ = server
    name = name_of(smollm2_path)
    small = plan(url, name, "8MiB")
    assert not small["fits"] and "too small" in small["error"] and small["layers"] == []
    assert small["required_bytes"] > 8 * MiB and sum(small["parts"].values()) == small["required_bytes"]
    assert small["range"]["min_bytes"] == small["required_bytes"]
    edge = plan(url, name, str(small["range"]["min_bytes"]))  # the slider's low end fits
    assert edge["fits"] and edge["total_bytes"] <= edge["budget_bytes"]
    assert plan(url, name, str(math.ceil(small["required_bytes"] / MiB) * MiB))["fits"]


@pytest.mark.parametrize("model", ["nope", "../SmolLM2-135M-Instruct.Q4_1", "/etc/passwd", "a\x00b"])
def test_an_unknown_model_is_404(server: tuple[str, ServerState], model: str) -> None:
    url, _ = server
    r = get(url, "/api/plan", model=model, budget="40MiB")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("budget", ["-1", "ten", "5 parsecs", "1.5.2G"])
def test_a_bad_budget_is_400(server: tuple[str, ServerState], smollm2_path: Path, budget: str) -> None:
    url, _ = server
    r = get(url, "/api/plan", model=name_of(smollm2_path), budget=budget)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "budget" and repr(budget) in err["message"]


def test_plan_without_a_model_and_none_loaded_is_400(server: tuple[str, ServerState]) -> None:
    url, state = server
    state.unload()
    r = get(url, "/api/plan", budget="40MiB")
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]


def test_devices_is_the_uaii_devices_table(server: tuple[str, ServerState]) -> None:
    from uaii.runtime.cli.system import device_rows

    url, _ = server
    data = get(url, "/api/devices").json()
    assert [b["name"] for b in data["backends"]] == [b["name"] for b in device_rows()]
    cpu = next(b for b in data["backends"] if b["name"] == "cpu")
    assert cpu["available"] and cpu["devices"]


def _generate(state: ServerState, n: int) -> None:
    from uaii.runtime.engine import GenRequest

    assert state.loaded is not None
    ids = state.loaded.session.tokenize("The capital of France is", add_special=True)
    result = state.loaded.engine.submit(GenRequest(prompt_ids=ids, max_tokens=n, ignore_eos=True)).result()
    assert len(result.token_ids) == n


def test_load_telemetry_bench_unload(server: tuple[str, ServerState], smollm2_path: Path) -> None:
    url, state = server
    name = name_of(smollm2_path)
    r = httpx.post(f"{url}/api/load", json={"model": name}, timeout=120)
    assert r.status_code == 200 and r.json()["loaded"] == name
    assert get(url, "/api/models").json()["loaded"] == name
    _generate(state, 8)
    t = get(url, "/api/telemetry").json()
    assert t["model"] == name and t["budget_bytes"] == BUDGET and t["rss_bytes"] > 0
    assert t["decode_tok_s"] > 0 and t["completion_tokens_total"] >= 8 and t["requests_total"] >= 1
    assert t["storage_mode"] == "streaming" and t["bytes_read_per_token"] > 0 and t["read_gb_s"] > 0
    assert t["expert_hit_rate"] is None  # a dense model has no expert cache
    deadline = time.monotonic() + 30
    while t["disk"] is None and time.monotonic() < deadline:  # measured once, in the background
        time.sleep(0.2)
        t = get(url, "/api/telemetry").json()
    assert t["disk"] is not None and t["disk"]["gb_s"] > 0 and smollm2_path.name in t["disk"]["method"]

    bench = httpx.post(f"{url}/api/bench", json={"prompt_tokens": 32, "gen_tokens": 8}, timeout=120)
    assert bench.status_code == 200, bench.text
    b = bench.json()
    assert b["model"] == name and b["prompt_tokens"] == 32 and b["new_tokens"] == 8
    assert b["prefill_tok_s"] > 0 and b["decode_tok_s"] > 0 and b["peak_rss_bytes"] > 0
    for bad in ({"gen_tokens": 0}, {"prompt_tokens": "16"}, {"prompt_tokens": 200, "gen_tokens": 100}):
        r = httpx.post(f"{url}/api/bench", json=bad, timeout=30)
        assert r.status_code == 400, (bad, r.text)
    assert httpx.post(f"{url}/api/bench", content=b"{oops", headers={"content-type": "application/json"},
                      timeout=30).status_code == 400

    assert httpx.post(f"{url}/api/unload", timeout=60).status_code == 415  # no JSON body: a foreign page's
    r = httpx.post(f"{url}/api/unload", json={}, timeout=60)
    assert r.status_code == 200 and r.json()["unloaded"] == name and state.loaded is None
    assert get(url, "/api/telemetry").json()["model"] is None
    r = httpx.post(f"{url}/api/bench", json={}, timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_loaded"
    r = httpx.post(f"{url}/api/load", json={"model": "../etc"}, timeout=30)
    assert r.status_code == 404


def test_an_unreadable_model_in_the_directory_does_not_hide_the_others(smollm2_path: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / smollm2_path.name).symlink_to(smollm2_path)
    (models / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)  # a header that runs past the end of the file
    state = ServerState(models_dir=models, session_options=dict(OPTIONS))
    with serving(state) as url:
        rows = {r["name"]: r for r in get(url, "/api/models").json()["models"]}
        assert set(rows) == {"broken", name_of(smollm2_path)}
        assert rows["broken"]["estimate"] is None and "broken.gguf" in rows["broken"]["error"]
        assert rows[name_of(smollm2_path)]["estimate"]["fits"] and rows[name_of(smollm2_path)]["error"] is None
        r = get(url, "/api/plan", model="broken", budget="40MiB")
        assert r.status_code == 400 and "broken" in r.json()["error"]["message"]
        assert state.loaded is None


def test_an_encoder_has_a_plan_and_telemetry_but_no_bench(tmp_path: Path) -> None:
    """A model that does not generate (BERT: /v1/embeddings only) has no engine: the dashboard still plans and
    samples it, and refuses a bench with a 409 that says why."""
    pytest.importorskip("transformers", reason="the tiny BERT is written with transformers (reference group)")
    import loader_helpers as H

    bert = H.save_tiny("bert", tmp_path / "bert")
    with serving(ServerState(model=bert, session_options={"plan_cache": False})) as url:
        t = get(url, "/api/telemetry").json()
        assert t["model"] == "bert" and t["decode_tok_s"] is None and t["rss_bytes"] > 0
        view = plan(url, "bert", "0")
        assert view["fits"] and view["kv_slots"] == 0 and view["parts"]["kv_cache"] == 0
        assert [g["group"] for g in view["layers"]] == [f"blk.{i}" for i in range(len(view["layers"]))]
        r = httpx.post(f"{url}/api/bench", json={}, timeout=30)
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_generative"


def test_the_api_asks_for_the_key_but_the_page_does_not(smollm2_path: Path) -> None:
    state = ServerState(model=smollm2_path, preload=False, session_options=dict(OPTIONS), api_key="sesame")
    with serving(state) as url:
        assert get(url, "/").status_code == 200 and get(url, "/static/app.js").status_code == 200
        for path in ("/api/models", "/api/telemetry", "/api/devices"):
            assert get(url, path).status_code == 401, path
        ok = httpx.get(f"{url}/api/telemetry", headers={"Authorization": "Bearer sesame"}, timeout=30)
        assert ok.status_code == 200


# ------------------------------------------------------------------------------------------------ pure data
def test_weight_groups_folds_modes_per_layer_in_layer_order() -> None:
    w = [WeightPlacement("m#blk.10.a", 100, "blk.10", "streamed"), WeightPlacement("m#emb", 50, "embed", "pinned"),
         WeightPlacement("m#blk.9.a", 30, "blk.9", "pinned"), WeightPlacement("m#blk.9.n", 2, "blk.9", "pinned"),
         WeightPlacement("m#blk.10.n", 4, "blk.10", "pinned"), WeightPlacement("m#blk.2.a", 7, "blk.2", "mmap")]
    layers, others = weight_groups(w)
    assert [g["group"] for g in layers] == ["blk.2", "blk.9", "blk.10"]
    assert [(g["mode"], g["bytes"], g["pinned"], g["streamed"], g["mmap"]) for g in layers] == [
        ("mmap", 7, 0, 0, 7), ("pinned", 32, 32, 0, 0), ("mixed", 104, 4, 100, 0)]
    assert [(g["group"], g["mode"]) for g in others] == [("embed", "pinned")]


@pytest.mark.parametrize("size", [1, 3 * MiB + 123])
def test_measure_read_reads_the_whole_file_once(tmp_path: Path, size: int) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    res = measure_read(path, block=MiB)
    assert res["bytes"] == size and res["gb_s"] > 0 and res["seconds"] > 0
    assert path.name in res["method"] and "page cache bypassed" in res["method"]
    assert measure_read(path, limit=1000, block=MiB)["bytes"] == min(size, 1000)
