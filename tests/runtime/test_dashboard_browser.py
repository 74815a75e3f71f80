"""The dashboard in a real browser: Debian's chromium driven by selenium through the system chromedriver (never a
downloaded one). It loads ``/``, chats (the streamed reply grows, then ends with its tok/s), opens the memory plan
(one bar per layer of SmolLM2), moves the budget slider (the pinned/streamed split follows), visits telemetry and
devices (and benches), and fails on any error in the browser console. With ``UAII_SCREENSHOT_DIR`` set it saves
``dashboard.png`` there (the memory plan at a 64 MiB budget): docs/images/dashboard.png is that picture."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_support import serving  # skips the module without the serve extra

from uaii.runtime.presets import MiB
from uaii.runtime.serve import ServerState

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
BUDGET = 64 * MiB  # some of SmolLM2's 92 MiB of weights stream: the plan has both colours
OPTIONS: dict[str, Any] = {"preset": "auto", "budget_bytes": BUDGET, "max_context": 256, "kv_window": 0}
N_LAYERS = 30  # SmolLM2-135M's blocks


def _need(what: str) -> None:
    """Skip with the reason, but fail under CI (CI=true): there, .ci/run installs the browser."""
    message = f"the browser test needs {what} (apt install chromium chromium-driver)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI=true: it must run here")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            _need(str(path))
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _need("the selenium package (dependency group serve)")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,820"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def url(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UAII_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        with serving(ServerState(model=smollm2_path, session_options=dict(OPTIONS))) as base:
            yield base


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not show {what} within {timeout:.0f} s")
        time.sleep(0.05)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(driver: Any, name: str) -> None:
    folder = os.environ.get("UAII_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


RECORD_REPLY = """
window.__reply = [];
new MutationObserver(() => {
  const m = document.querySelectorAll('#messages .msg.assistant');
  const last = m[m.length - 1];
  if (last) window.__reply.push([last.querySelector('.text').textContent.length, last.dataset.state || '']);
}).observe(document.querySelector('#messages'), {subtree: true, childList: true, characterData: true,
  attributes: true});
"""


def chat(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    driver.execute_script(RECORD_REPLY)
    for field, value in (("temperature", "0"), ("max_tokens", "24")):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "prompt").send_keys("Say hello to the dashboard in one sentence.")
    driver.find_element(By.ID, "send").click()
    reply = wait_for("the reply", lambda: driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant"))[-1]
    wait_for("the end of the reply", lambda: reply.get_attribute("data-state") == "done", 60)
    seen = driver.execute_script("return window.__reply")
    growing = sorted({n for n, st in seen if st == "streaming" and n > 0})
    assert len(growing) >= 2, f"the reply did not grow while streaming: {seen}"
    text = reply.find_element(By.CSS_SELECTOR, ".text").text
    assert text.strip() and len(text) >= growing[-1], text
    assert float(reply.get_attribute("data-tok-s")) > 0 and float(reply.get_attribute("data-ttft-s")) > 0
    assert reply.get_attribute("data-finish") in ("stop", "length")
    assert "tok/s" in reply.find_element(By.CSS_SELECTOR, ".stats").text


def stop_a_reply(driver: Any, url: str) -> None:
    """The stop button aborts the stream mid-reply; the server frees the sequence (no request stays active)."""
    import httpx
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "max_tokens")
    box.clear()
    box.send_keys("120")  # the context is 256 tokens: the first exchange and this prompt take ~90
    driver.find_element(By.ID, "prompt").send_keys("Count from one to one hundred in words.")
    driver.find_element(By.ID, "send").click()
    reply = wait_for("a second reply", lambda: (m := driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))[1:]
                     and m[-1])
    wait_for("the reply streaming", lambda: reply.find_element(By.CSS_SELECTOR, ".text").text)
    assert "error" not in (reply.get_attribute("class") or ""), reply.text
    driver.find_element(By.ID, "stop").click()
    wait_for("the stopped reply", lambda: reply.get_attribute("data-state") == "done")
    assert reply.get_attribute("data-finish") == "stopped" and int(reply.get_attribute("data-tokens")) < 120
    wait_for("the sequence freed", lambda: httpx.get(f"{url}/api/telemetry").json()["requests_active"] == 0, 5)


PLAN_FIGURES = """
const s = document.querySelector('#plan-summary').dataset;
const bars = [...document.querySelectorAll('#plan-svg g.layer')];
return {budget: Number(s.budget ?? -1), pinned: Number(s.pinnedBytes ?? -1), streamed: Number(s.streamedBytes ?? -1),
        layers: bars.map((b) => b.dataset.layer), modes: bars.map((b) => b.dataset.mode)};
"""


def plan_figures(driver: Any) -> dict[str, Any]:
    """What the plan picture shows now, read in one script (the SVG is redrawn as a whole on every change)."""
    return driver.execute_script(PLAN_FIGURES)  # type: ignore[no-any-return]


def move_slider(driver: Any, key: str, before: dict[str, Any]) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "budget-slider").send_keys(key)
    return wait_for(f"the plan redrawn after {key!r}",
                    lambda: (f := plan_figures(driver))["budget"] != before["budget"] and f, 20)


def check_plan(driver: Any) -> None:
    """One bar per layer at the server's budget; the slider's ends (every weight pinned, the smallest plan) move
    the split between pinned and streamed weights, drawn without loading anything."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.ID, "tab-plan").click()
    start = wait_for("the layer bars", lambda: len((f := plan_figures(driver))["layers"]) == N_LAYERS and f)
    assert start["layers"] == [f"blk.{i}" for i in range(N_LAYERS)] and start["budget"] == BUDGET
    assert start["pinned"] > 0 and start["streamed"] > 0  # 64 MiB holds some of the weights, not all
    screenshot(driver, "dashboard.png")
    top = move_slider(driver, Keys.END, start)  # every weight fits: nothing streams
    assert top["budget"] > BUDGET and top["streamed"] == 0 and top["pinned"] > start["pinned"]
    assert set(top["modes"]) == {"pinned"}
    low = move_slider(driver, Keys.HOME, top)  # the smallest plan that fits: most weights stream
    assert low["budget"] < BUDGET and low["pinned"] < start["pinned"] and low["streamed"] > start["streamed"]
    assert len(low["layers"]) == N_LAYERS and low["modes"].count("streamed") > start["modes"].count("streamed")


def visit_tabs(driver: Any, model: str) -> None:
    """Models (the row of the loaded model), devices (the cpu row, then a bench run), telemetry (live tok/s)."""
    from selenium.webdriver.common.by import By

    def tab(name: str) -> None:
        driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-tab="{name}"]').click()

    def shown(css: str) -> Callable[[], Any]:
        return lambda: driver.find_elements(By.CSS_SELECTOR, css)

    tab("models")
    wait_for("the models table", shown(f'#models-table tr[data-model="{model}"]'))
    tab("devices")
    wait_for("the devices table", shown('#devices-table tr[data-backend="cpu"]'))
    driver.find_element(By.ID, "bench-run").click()
    wait_for("a bench row", shown("#bench-table tbody tr"), 60)
    tab("telemetry")
    wait_for("telemetry with tok/s", lambda: "tok/s" in driver.find_element(By.ID, "telemetry-now").text)


@pytest.mark.slow  # ~12 s: runs once in `make pytest`, not again in each isolation venv
def test_dashboard_in_a_real_browser(browser: Any, url: str, smollm2_path: Path) -> None:
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    browser.get(f"{url}/")
    name = smollm2_path.name.removesuffix(".gguf")
    wait_for("the loaded model", lambda: name in browser.find_element(By.ID, "status").text)
    chat(browser)
    stop_a_reply(browser, url)
    check_plan(browser)
    visit_tabs(browser, name)
    errors = console_errors(browser)
    assert not errors, f"browser console errors: {errors}"
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_dashboard_asks_for_the_api_key(browser: Any, smollm2_path: Path) -> None:
    """A server with a key: the page asks for it once, keeps it in sessionStorage and sends it as Bearer."""
    from selenium.webdriver.common.by import By

    state = ServerState(model=smollm2_path, preload=False, session_options=dict(OPTIONS), api_key="open sesame")
    with serving(state) as base:
        browser.get(f"{base}/")
        wait_for("the key dialog", lambda: browser.find_element(By.ID, "key-dialog").get_attribute("open") is not None)
        browser.find_element(By.ID, "key-input").send_keys("open sesame")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait_for("the models", lambda: "no model loaded" in browser.find_element(By.ID, "status").text)
        assert browser.execute_script("return sessionStorage.getItem('uaii.apiKey')") == "open sesame"
        # the 401s that made the page ask are the only errors the console may show
        errors = [e for e in console_errors(browser) if "status of 401" not in e["message"]]
        assert not errors, f"browser console errors: {errors}"
