// UAII dashboard: plain JavaScript, no framework and no build step; it talks to the server it was served by.
// Charts are drawn here: the memory plan as inline SVG (elements carry data-* attributes a test can read), the
// telemetry and bench figures on <canvas>.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const KEY = "uaii.apiKey";
const state = { models: [], loaded: null, budget: 0, planSeq: 0, planTimer: 0, abort: null, history: [],
  series: { tok: [], bpt: [], gbs: [], disk: [], hit: [], rss: [], budget: [] }, bench: [] };

// ------------------------------------------------------------------------------------------------ formatting
function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(Math.abs(v) < 100 ? 1 : 0)} ${units[i]}`;
}
const fmtNum = (x, d = 1) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== "") e.textContent = text;
  return e;
}
function svg(tag, attrs = {}, text = "") {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== "") e.textContent = text;
  return e;
}

// --------------------------------------------------------------------------------------- API (with the key)
let keyWait = null; // one dialog for every request that met a 401 meanwhile
function askKey() {
  if (!keyWait) {
    keyWait = new Promise((resolve) => {
      $("#key-form").onsubmit = () => {
        sessionStorage.setItem(KEY, $("#key-input").value.trim());
        keyWait = null;
        resolve();
      };
      $("#key-dialog").showModal();
    });
  }
  return keyWait;
}
async function api(path, opts = {}, retried = false) {
  const headers = Object.assign({}, opts.headers || {});
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (opts.json !== undefined) { headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(opts.json); }
  const resp = await fetch(path, Object.assign({}, opts, { headers }));
  if (resp.status === 401 && !retried) { await askKey(); return api(path, opts, true); }
  return resp;
}
async function apiJson(path, opts = {}) {
  const resp = await api(path, opts);
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error((body.error && body.error.message) || `${resp.status} ${resp.statusText}`);
  return body;
}

// ----------------------------------------------------------------------------------------------------- tabs
function showTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const s of document.querySelectorAll("main > section")) s.classList.toggle("active", s.id === name);
  if (name === "plan") refreshPlan();
  if (name === "devices" && !$("#devices-table tbody").children.length) loadDevices();
  if (name === "telemetry") drawTelemetry();
}

// --------------------------------------------------------------------------------------------------- models
async function loadModels() {
  const data = await apiJson("/api/models");
  state.models = data.models;
  state.loaded = data.loaded;
  state.budget = data.budget_bytes;
  $("#status").textContent = `${data.loaded ? `model ${data.loaded}` : "no model loaded"} · preset ` +
    `${data.preset || "–"} · budget ${data.budget_bytes ? fmtBytes(data.budget_bytes) : "unlimited"}`;
  const body = $("#models-table tbody");
  body.replaceChildren();
  for (const m of data.models) body.appendChild(modelRow(m));
  const sel = $("#plan-model"), before = sel.value;
  sel.replaceChildren(...data.models.map((m) => el("option", { value: m.name }, m.name)));
  sel.value = before || data.loaded || (data.models[0] && data.models[0].name) || "";
}
function modelRow(m) {
  const tr = el("tr", { "data-model": m.name });
  if (m.loaded) tr.classList.add("loaded");
  const est = m.estimate || {}, parts = est.parts || {};
  const mix = Object.entries(m.quant_mix || {}).map(([t, r]) => `${t}×${r.count}`).join(" ");
  const cells = [m.name, m.architecture || "–", fmtBytes(m.size_bytes), mix || "–",
    est.fits === false ? "does not fit" : fmtBytes(est.total_bytes), fmtBytes(parts.pinned),
    fmtBytes(est.streamed_bytes_per_token), fmtBytes(parts.kv_cache), fmtBytes(parts.arena)];
  cells.forEach((c, i) => tr.appendChild(el("td", i >= 4 ? { class: "num" } : {}, c)));
  if (m.error || est.error) tr.cells[4].title = m.error || est.error;
  const td = el("td"), btn = el("button", { type: "button", class: m.loaded ? "unload" : "load" },
    m.loaded ? "Unload" : "Load");
  btn.onclick = () => loadOrUnload(m.loaded ? null : m.name, btn);
  td.appendChild(btn);
  tr.appendChild(td);
  return tr;
}
async function loadOrUnload(name, btn) {
  btn.disabled = true;
  btn.textContent = name ? "loading…" : "unloading…";
  try {
    await apiJson(name ? "/api/load" : "/api/unload", { method: "POST", json: name ? { model: name } : {} });
  } catch (err) {
    $("#models-note").textContent = err.message;
  }
  await loadModels();
}

// ---------------------------------------------------------------------------------------------- memory plan
function sliderBytes() {
  return $("#budget-unlimited").checked ? 0 : Number($("#budget-slider").value) * 1048576;
}
function schedulePlan() {
  $("#budget-value").textContent = sliderBytes() ? fmtBytes(sliderBytes()) : "unlimited";
  clearTimeout(state.planTimer);
  state.planTimer = setTimeout(() => refreshPlan(sliderBytes()), 120);
}
async function refreshPlan(budget) {
  const model = $("#plan-model").value;
  if (!model) return;
  const seq = ++state.planSeq;
  const q = new URLSearchParams({ model });
  if (budget !== undefined) q.set("budget", String(budget));
  let plan;
  try {
    plan = await apiJson(`/api/plan?${q}`);
  } catch (err) {
    if (seq === state.planSeq) $("#plan-summary").textContent = err.message;
    return;
  }
  if (seq !== state.planSeq) return; // a newer budget was asked for meanwhile
  if (budget === undefined) setSlider(plan);
  drawPlan(plan);
}
function setSlider(plan) {
  const s = $("#budget-slider"), r = plan.range || {};
  s.min = String(Math.max(1, Math.ceil((r.min_bytes || 1048576) / 1048576)));
  s.max = String(Math.max(Number(s.min) + 1, Math.ceil((r.max_bytes || plan.total_bytes) / 1048576)));
  $("#budget-unlimited").checked = !plan.budget_bytes;
  s.value = String(plan.budget_bytes ? Math.round(plan.budget_bytes / 1048576) : s.max);
  $("#budget-value").textContent = plan.budget_bytes ? fmtBytes(plan.budget_bytes) : "unlimited";
}
function summarize(plan) {
  const sum = (k) => plan.layers.concat(plan.others).reduce((a, g) => a + g[k], 0);
  return { pinned: sum("pinned"), streamed: sum("streamed"), mmap: sum("mmap") };
}
function drawPlan(plan) {
  const root = $("#plan-svg"), s = summarize(plan), p = $("#plan-summary");
  root.replaceChildren();
  root.dataset.budget = String(plan.budget_bytes);
  Object.assign(p.dataset, { pinnedBytes: s.pinned, streamedBytes: s.streamed, mappedBytes: s.mmap,
    fits: String(plan.fits), layers: String(plan.layers.length), budget: String(plan.budget_bytes) });
  p.textContent = plan.fits
    ? `${plan.model} at ${plan.budget_bytes ? fmtBytes(plan.budget_bytes) : "no budget"} on ${plan.device}: ` +
      `${fmtBytes(plan.total_bytes)} held (weights pinned ${fmtBytes(s.pinned)}), ${fmtBytes(s.streamed)} stream ` +
      `(${fmtBytes(plan.streamed_bytes_per_token)} read per token), ${fmtBytes(s.mmap)} memory-mapped; ` +
      `KV cache for ${plan.kv_slots} tokens (${plan.kv_dtype})${plan.cache_hit ? " · plan from the cache" : ""}`
    : `Does not fit: ${plan.error}`;
  drawLayers(root, plan);
  drawBudgetBar(root, plan);
}
function drawLayers(root, plan) {
  // the layers in order, then (after a gap) embeddings, lm_head, final norm; one scale: the largest layer
  const groups = plan.layers.concat([null], plan.others);
  const x0 = 60, w = 880, top = 30, h = 160;
  root.appendChild(svg("text", { x: 8, y: 14 }, "weights per layer (bar height: bytes; colour: how they are held)"));
  root.appendChild(svg("line", { x1: x0, y1: top + h, x2: x0 + w, y2: top + h, class: "axis" }));
  if (!plan.layers.length && !plan.others.length) return;
  const maxLayer = Math.max(1, ...plan.layers.map((g) => g.bytes));
  const step = w / groups.length, bw = Math.max(2, step * 0.75);
  root.appendChild(svg("text", { x: 4, y: top + 10 }, fmtBytes(maxLayer)));
  groups.forEach((g, i) => {
    if (g === null) return;
    const isLayer = /^blk\.\d+$/.test(g.group);
    const grp = svg("g", Object.assign({ "data-mode": g.mode, "data-bytes": g.bytes, "data-pinned": g.pinned,
      "data-streamed": g.streamed, "data-mmap": g.mmap }, isLayer ? { "data-layer": g.group, class: "layer" }
      : { "data-group": g.group, class: "global" }));
    const scale = Math.min(1, g.bytes / maxLayer), x = x0 + i * step;
    let y = top + h;
    for (const mode of ["pinned", "streamed", "mmap"]) {
      if (!g[mode]) continue;
      const bh = (h * scale * g[mode]) / g.bytes;
      y -= bh;
      grp.appendChild(svg("rect", { x, y, width: bw, height: Math.max(bh, 0.5), class: mode, "data-mode": mode }));
    }
    if (g.bytes > maxLayer) grp.appendChild(svg("text", { x, y: top - 4 }, `↑ ${fmtBytes(g.bytes)}`));
    grp.appendChild(svg("title", {}, `${g.group}: ${fmtBytes(g.bytes)} — pinned ${fmtBytes(g.pinned)}, ` +
      `streamed ${fmtBytes(g.streamed)}, mapped ${fmtBytes(g.mmap)}`));
    const label = isLayer ? (Number(g.group.slice(4)) % 5 === 0 ? g.group : "") : g.group;
    if (label) grp.appendChild(svg("text", { x, y: top + h + 13 + (isLayer ? 0 : 12 * (i % 2)) }, label));
    root.appendChild(grp);
  });
}
function drawBudgetBar(root, plan) {
  const x0 = 60, w = 820, y = 250, h = 28, parts = plan.parts;
  const total = Object.values(parts).reduce((a, b) => a + b, 0);
  const perToken = plan.streamed_bytes_per_token || 0;
  const scale = w / Math.max(1, total, plan.budget_bytes, perToken) / 1.05;
  root.appendChild(svg("text", { x: 8, y: y - 12 }, "memory held against the budget"));
  let x = x0;
  for (const [part, bytes] of Object.entries(parts)) {
    if (!bytes) continue;
    const bw = bytes * scale;
    const r = svg("rect", { x, y, width: Math.max(bw, 0.5), height: h, class: part, "data-part": part,
      "data-bytes": bytes });
    r.appendChild(svg("title", {}, `${part.replace("_", " ")}: ${fmtBytes(bytes)}`));
    root.appendChild(r);
    if (bw > 70) root.appendChild(svg("text", { x: x + 4, y: y + 18, class: "on-bar" }, part.replace("_", " ")));
    x += bw;
  }
  root.appendChild(svg("text", { x: x + 6, y: y + 18 }, `${fmtBytes(total)}${plan.fits ? "" : " needed"}`));
  if (perToken) {
    const r = svg("rect", { x: x0, y: y + h + 6, width: perToken * scale, height: 8, class: "streamed",
      "data-part": "streamed_per_token", "data-bytes": perToken });
    r.appendChild(svg("title", {}, `read from storage per token (not held): ${fmtBytes(perToken)}`));
    root.appendChild(r);
    root.appendChild(svg("text", { x: x0 + perToken * scale + 6, y: y + h + 14 }, `${fmtBytes(perToken)} read per token`));
  }
  if (plan.budget_bytes) {
    const bx = x0 + plan.budget_bytes * scale;
    root.appendChild(svg("line", { id: "budget-line", x1: bx, x2: bx, y1: y - 8, y2: y + h + 18, class: "budget",
      "data-budget": plan.budget_bytes }));
    root.appendChild(svg("text", { x: bx - 40, y: y + h + 32, class: plan.fits ? "" : "warn" },
      `budget ${fmtBytes(plan.budget_bytes)}`));
  } else {
    root.appendChild(svg("text", { x: x0, y: y + h + 32 }, "no budget: every weight is memory-mapped"));
  }
}

// ----------------------------------------------------------------------------------------------------- chat
function addMessage(role, text) {
  const div = el("div", { class: `msg ${role}` });
  div.appendChild(el("span", { class: "text" }, text));
  $("#messages").appendChild(div);
  $("#messages").scrollTop = $("#messages").scrollHeight;
  return div;
}
function chatBody() {
  const body = { messages: state.history, stream: true, stream_options: { include_usage: true },
    temperature: Number($("#temperature").value), top_p: Number($("#top_p").value),
    max_tokens: Number($("#max_tokens").value) };
  const model = state.loaded || $("#plan-model").value;
  if (model) body.model = model;
  if ($("#seed").value !== "") body.seed = Number($("#seed").value);
  return body;
}
async function sendChat(ev) {
  ev.preventDefault();
  const text = $("#prompt").value.trim();
  if (!text || state.abort) return;
  $("#prompt").value = "";
  addMessage("user", text);
  state.history.push({ role: "user", content: text });
  const reply = addMessage("assistant", ""), out = $(".text", reply), stats = el("span", { class: "stats" });
  reply.appendChild(stats);
  reply.dataset.state = "streaming";
  state.abort = new AbortController();
  $("#send").disabled = true;
  $("#stop").disabled = false;
  const t0 = performance.now(), t = { first: 0, last: 0, chunks: 0, usage: null, finish: null };
  try {
    const resp = await api("/v1/chat/completions", { method: "POST", json: chatBody(), signal: state.abort.signal });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || `${resp.status} ${resp.statusText}`);
    }
    await readSse(resp, (chunk) => onChunk(chunk, out, t));
  } catch (err) {
    if (err.name !== "AbortError") { reply.classList.add("error"); out.textContent += `\n[${err.message}]`; }
    else t.finish = "stopped";
  } finally {
    state.abort = null;
    $("#send").disabled = false;
    $("#stop").disabled = true;
  }
  state.history.push({ role: "assistant", content: out.textContent });
  finishReply(reply, stats, t0, t);
  if (!state.loaded) loadModels().catch(() => {}); // the request loaded the model it named
}
function onChunk(chunk, out, t) {
  if (chunk.usage) t.usage = chunk.usage;
  for (const c of chunk.choices || []) {
    const piece = c.delta && c.delta.content;
    if (piece) {
      const now = performance.now();
      if (!t.first) t.first = now;
      t.last = now;
      t.chunks++;
      out.textContent += piece;
      $("#messages").scrollTop = $("#messages").scrollHeight;
    }
    if (c.finish_reason) t.finish = c.finish_reason;
  }
}
async function readSse(resp, onData) {
  const reader = resp.body.getReader(), decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = frame.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}
function finishReply(reply, stats, t0, t) {
  const n = t.usage ? t.usage.completion_tokens : t.chunks;
  const rate = n > 1 && t.last > t.first ? ((n - 1) * 1000) / (t.last - t.first) : null;
  const ttft = t.first ? (t.first - t0) / 1000 : null;
  Object.assign(reply.dataset, { state: "done", tokens: String(n), finish: t.finish || "",
    tokS: rate === null ? "" : rate.toFixed(2), ttftS: ttft === null ? "" : ttft.toFixed(3) });
  stats.textContent = `${n} tokens · ${rate === null ? "–" : fmtNum(rate)} tok/s · time to first token ` +
    `${ttft === null ? "–" : `${fmtNum(ttft, 2)} s`} · ${t.finish || "?"}`;
}

// ------------------------------------------------------------------------------------------------ telemetry
async function pollTelemetry() {
  if (document.hidden) return;
  let d;
  try { d = await apiJson("/api/telemetry"); } catch (err) { $("#telemetry-now").textContent = err.message; return; }
  const push = (k, v) => { state.series[k].push(v === undefined ? null : v); if (state.series[k].length > 120) state.series[k].shift(); };
  push("tok", d.decode_tok_s); push("bpt", d.bytes_read_per_token); push("gbs", d.read_gb_s);
  push("disk", d.disk ? d.disk.gb_s : null); push("hit", d.expert_hit_rate); push("rss", d.rss_bytes);
  push("budget", d.budget_bytes || null);
  if (d.disk) $("#disk-info").title = `the disk's ${fmtNum(d.disk.gb_s, 2)} GB/s: ${d.disk.method}`;
  $("#telemetry-now").textContent = `${d.model || "no model"} · ${d.requests_active || 0} active, ` +
    `${d.requests_queued || 0} queued, ${d.requests_total || 0} requests · ${fmtNum(d.decode_tok_s)} tok/s · ` +
    `RSS ${fmtBytes(d.rss_bytes)}`;
  if ($("#telemetry").classList.contains("active")) drawTelemetry();
}
function drawTelemetry() {
  const S = state.series;
  lineChart($("#chart-tok"), [{ v: S.tok, c: "#2f5fa7", label: "tok/s" }], (x) => fmtNum(x));
  lineChart($("#chart-bpt"), [{ v: S.bpt, c: "#e0822f", label: "bytes/token" }], fmtBytes);
  lineChart($("#chart-gbs"), [{ v: S.gbs, c: "#2e8b57", label: "read" }, { v: S.disk, c: "#8a95a5", label: "disk" }],
    (x) => `${fmtNum(x, 2)} GB/s`);
  lineChart($("#chart-hit"), [{ v: S.hit, c: "#d9534f", label: "hit rate" }], (x) => `${fmtNum(100 * x, 0)} %`,
    "no expert cache in use (a dense model, or every expert pinned)");
  lineChart($("#chart-rss"), [{ v: S.rss, c: "#3a8fd6", label: "RSS" }, { v: S.budget, c: "#c0392b", label: "budget" }],
    fmtBytes);
}
function lineChart(canvas, series, fmt, empty = "no data yet") {
  const g = canvas.getContext("2d"), W = canvas.width, H = canvas.height, L = 70, B = 16;
  g.clearRect(0, 0, W, H);
  const all = series.flatMap((s) => s.v.filter((x) => x !== null));
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#6b7075";
  if (!all.length) { g.fillText(empty, L, H / 2); return; }
  const hi = Math.max(...all) * 1.1 || 1, n = Math.max(2, ...series.map((s) => s.v.length));
  g.fillText(fmt(hi), 2, 12);
  g.fillText(fmt(0), 2, H - B);
  g.strokeStyle = "#d8dadc";
  g.strokeRect(L, 2, W - L - 2, H - B - 2);
  series.forEach((s, k) => {
    g.strokeStyle = s.c;
    g.lineWidth = 1.5;
    g.beginPath();
    let pen = false;
    s.v.forEach((y, i) => {
      if (y === null) { pen = false; return; }
      const px = L + ((W - L - 4) * i) / (n - 1), py = H - B - ((H - B - 4) * y) / hi;
      if (pen) g.lineTo(px, py); else g.moveTo(px, py);
      pen = true;
    });
    g.stroke();
    g.fillStyle = s.c;
    const last = s.v.filter((x) => x !== null).pop();
    g.fillText(`${s.label} ${last === undefined ? "–" : fmt(last)}`, L + 6 + k * 150, H - 3);
  });
}

// -------------------------------------------------------------------------------------------- devices, bench
async function loadDevices() {
  const d = await apiJson("/api/devices");
  const body = $("#devices-table tbody");
  body.replaceChildren(...d.backends.map((b) => {
    const tr = el("tr", { "data-backend": b.name });
    const status = b.available ? (b.software ? "software" : "available") : "unavailable";
    [b.name, status, b.available ? b.devices.join(", ") : b.reason].forEach((c) => tr.appendChild(el("td", {}, c)));
    return tr;
  }));
  const box = $("#adapters");
  box.replaceChildren();
  for (const [name, info] of Object.entries(d.adapters || {})) {
    const text = info.adapters.length
      ? info.adapters.map((a) => `#${a.index} ${a.name} (${a.backend}, ${a.type || "unknown type"}` +
        `${a.software ? ", software" : ""}, memory ${a.memory_bytes ? fmtBytes(a.memory_bytes) : "not reported"})`).join("; ")
      : `none${info.reason ? ` (${info.reason})` : ""}`;
    box.appendChild(el("p", { class: "muted" }, `${name} adapters: ${text}`));
  }
}
async function runBench() {
  const btn = $("#bench-run");
  btn.disabled = true;
  $("#bench-status").textContent = "running…";
  try {
    const r = await apiJson("/api/bench", { method: "POST", json: { prompt_tokens: Number($("#bench-prompt").value),
      gen_tokens: Number($("#bench-gen").value) } });
    state.bench.push(r);
    const tr = el("tr");
    [state.bench.length, r.model, fmtNum(r.prefill_tok_s), fmtNum(r.decode_tok_s), `${fmtNum(r.ttft_s, 3)} s`,
      fmtBytes(r.peak_rss_bytes), fmtBytes(r.bytes_read_per_token)].forEach((c) => tr.appendChild(el("td", {}, String(c))));
    $("#bench-table tbody").appendChild(tr);
    $("#bench-status").textContent = `done in ${fmtNum(r.wall_s, 2)} s`;
    drawBench();
  } catch (err) {
    $("#bench-status").textContent = err.message;
  } finally {
    btn.disabled = false;
  }
}
function drawBench() {
  const c = $("#chart-bench"), g = c.getContext("2d"), W = c.width, H = c.height, runs = state.bench.slice(-8);
  g.clearRect(0, 0, W, H);
  const hi = Math.max(1, ...runs.flatMap((r) => [r.prefill_tok_s || 0, r.decode_tok_s || 0])) * 1.15;
  g.font = "11px system-ui, sans-serif";
  runs.forEach((r, i) => {
    const x = 40 + i * 105;
    [[r.prefill_tok_s, "#2f5fa7", "prefill"], [r.decode_tok_s, "#e0822f", "decode"]].forEach(([v, col, lab], k) => {
      const bh = ((H - 40) * (v || 0)) / hi;
      g.fillStyle = col;
      g.fillRect(x + k * 42, H - 20 - bh, 38, bh);
      g.fillText(`${fmtNum(v, 0)}`, x + k * 42, H - 24 - bh);
      g.fillStyle = "#6b7075";
      g.fillText(lab, x + k * 42, H - 6);
    });
  });
  g.fillStyle = "#6b7075";
  g.fillText("tok/s per bench run (last 8)", 40, 12);
}

// ----------------------------------------------------------------------------------------------------- wire
function init() {
  for (const b of document.querySelectorAll("#tabs button")) b.onclick = () => showTab(b.dataset.tab);
  $("#chat-form").onsubmit = sendChat;
  $("#prompt").onkeydown = (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#send").click(); } };
  $("#stop").onclick = () => state.abort && state.abort.abort();
  $("#clear").onclick = () => { state.history = []; $("#messages").replaceChildren(); };
  $("#budget-slider").oninput = () => { $("#budget-unlimited").checked = false; schedulePlan(); };
  $("#budget-unlimited").onchange = schedulePlan;
  $("#plan-model").onchange = () => refreshPlan();
  $("#bench-run").onclick = runBench;
  loadModels().catch((err) => { $("#status").textContent = err.message; });
  pollTelemetry();
  setInterval(pollTelemetry, 1000);
}
document.addEventListener("DOMContentLoaded", init);
