"""Mixture of experts on the device: MoERouter, MoEExperts and MoEExpertsSwiGLU.

The router is one thread per token (softmax or sigmoid over a few dozen experts, then top-k by repeated
selection, ties to the lower index). The experts run as three GEMV passes over the packed banks, with the GEMV
core of linalg.py (a row's threads stride over its 32-value units, then reduce in workgroup memory — or, on a
device with subgroups, with ``subgroupAdd`` as linalg.GEMV_SG explains); a "row" is one output feature of one
(token, slot) pair, and its weight row is found through the slot's expert index:

1. gate: ``G[t, j, f] = gate[e] [f] · X[t]``;
2. up:   ``G[t, j, f] = act(G[t, j, f]) * (up[e] [f] · X[t])`` (in place);
3. down: ``Y[t, d] = sum_j weights[t, j] * (down[e] [d] · G[t, j])``.

Banks stay packed, each in its own type, and are split by experts into shards when larger than one storage
binding; each shard's dispatch computes the rows whose expert it holds (down accumulates over shards).
"""

from __future__ import annotations

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import GpuWeight, Lower, Lowering
from uaii.backends.webgpu.ops.dequant import UNIT, Decoder, decoder
from uaii.backends.webgpu.ops.elementwise import MATH
from uaii.backends.webgpu.ops.linalg import WG, reduce_wgsl, row_dot_wgsl, threads_per_row
from uaii.backends.webgpu.program import Region

ROUTER = """// moe router {scoring}
struct P {{ t: u32, e: u32, k: u32, norm: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> L: array<f32>;
@group(0) @binding(2) var<storage, read_write> WO: array<f32>;
@group(0) @binding(3) var<storage, read_write> IO: array<i32>;
fn score(x: f32, mx: f32, sum: f32) -> f32 {{ {score} }}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let tok = gid.x + gid.y * nwg.x * 64u;
  if (tok >= p.t) {{ return; }}
  let b = tok * p.e; let o = tok * p.k;
  var mx = L[b];
  for (var i = 1u; i < p.e; i = i + 1u) {{ mx = max(mx, L[b + i]); }}
  var sum = 0.0;
  for (var i = 0u; i < p.e; i = i + 1u) {{ sum = sum + exp(L[b + i] - mx); }}
  var total = 0.0;
  for (var j = 0u; j < p.k; j = j + 1u) {{
    var best = -1;
    for (var i = 0u; i < p.e; i = i + 1u) {{
      var taken = false;
      for (var c = 0u; c < j; c = c + 1u) {{ taken = taken || IO[o + c] == i32(i); }}
      if (!taken && (best < 0 || L[b + i] > L[b + u32(best)])) {{ best = i32(i); }}
    }}
    IO[o + j] = best;
    let w = score(L[b + u32(best)], mx, sum);
    WO[o + j] = w;
    total = total + w;
  }}
  if (p.norm == 1u) {{
    for (var j = 0u; j < p.k; j = j + 1u) {{ WO[o + j] = WO[o + j] / total; }}
  }}
}}
"""

SCORES = {"softmax": "return exp(x - mx) / sum;", "sigmoid": "return 1.0 / (1.0 + exp(-x));"}


def router(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    logits, (w, idx) = node.inputs[0], node.outputs[:2]
    at = info.attrs
    e, k = int(at["n_experts"]), int(at["top_k"])
    t = ctx.count(logits) // e
    scoring = str(at.get("scoring", "softmax"))
    src = ROUTER.format(scoring=scoring, score=SCORES[scoring])
    ctx.dispatch(src, [ctx.region(logits), ctx.region(w), ctx.region(idx)],
                 [t, e, k, int(bool(at.get("normalize", True)))], -(-t // 64))


ACT = {"silu": "silu(g)", "gelu": "gelu_erf(g)"}
"""The expert activations, from elementwise.MATH: the same functions the Silu and Gelu ops compute."""

EXPERT_HEAD = """struct P {{ rows: u32, units: u32, row_bytes: u32, expert_bytes: u32, e0: u32, e1: u32, k: u32,
           per: u32, ldx: u32, groups: u32, acc: u32, _p: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> IDX: array<i32>;
{outs}{lib}{math}
var<workgroup> red: array<f32, {wg}>;
"""
"""What both expert kernels declare: params, bindings W, X, IDX and the pass's outputs, the decoder library, the
activations and the workgroup reduction array."""

EXPERT = """// moe {mode} {dtype} tpr={tpr} act={act}
"""+EXPERT_HEAD+"""@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let g0 = wid.x + wid.y * nwg.x;
  let t = li % {tpr}u; let row = g0 * {rpw}u + li / {tpr}u;
  var acc: array<f32, 1>;
  var hit = false;
  if (row < p.rows) {{
{rowmap}  }}
{reduce}  if (t == 0u && hit) {{
{store}  }}
}}
"""

_GATE_UP_MAP = """    let slot = row / p.per; let f = row % p.per; let e = IDX[slot];
    if (e >= i32(p.e0) && e < i32(p.e1)) {
      hit = true;
      acc = row_dot((u32(e) - p.e0) * p.expert_bytes + f * p.row_bytes, (slot / p.k) * p.ldx, p.ldx, 1u, t, p.units);
    }
"""
_DOWN_MAP = """    let tok = row / p.per; let d = row % p.per;
    hit = true;
    for (var j = 0u; j < p.k; j = j + 1u) {
      let slot = tok * p.k + j; let e = IDX[slot];
      if (e >= i32(p.e0) && e < i32(p.e1)) {
        let part = row_dot((u32(e) - p.e0) * p.expert_bytes + d * p.row_bytes, slot * p.ldx, p.ldx, 1u, t, p.units);
        acc[0] = acc[0] + RW[slot] * part[0];
      }
    }
"""
_STORE = {
    "gate": "    G[row] = red[li];\n",
    "up": "    let g = G[row];\n    G[row] = ({act}) * red[li];\n",
    "down": "    Y[row] = select(0.0, Y[row], p.acc == 1u) + red[li];\n",
}


EXPERT_SG = """// moe {mode} {dtype} tpr={tpr} act={act} subgroups
"""+EXPERT_HEAD+"""var<workgroup> hits: array<u32, {rpw}>;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32) {{
  let g0 = wid.x + wid.y * nwg.x;
  let lanes = subgroupAdd(1u); let rank = subgroupExclusiveAdd(1u);
  let parts = max(1u, nsg / {rpw}u);
  var acc: array<f32, 1>; var hit: bool;  // reset in the loop: naga initializes a loop-body `var` only once
  for (var job = sg; job < {rpw}u * parts; job = job + nsg) {{
    let row = g0 * {rpw}u + job % {rpw}u; let t = (job / {rpw}u) * lanes + rank; let st = parts * lanes;
    acc = array<f32, 1>(); hit = false;
    if (row < p.rows) {{
{rowmap}    }}
    let s = subgroupAdd(acc[0]);
    if (rank == 0u) {{ red[job] = s; if (job < {rpw}u) {{ hits[job] = u32(hit); }} }}
  }}
  workgroupBarrier();
  let row = g0 * {rpw}u + li;
  if (li < {rpw}u && row < p.rows && hits[li] == 1u) {{
    var tot = 0.0;
    for (var q = 0u; q < parts; q = q + 1u) {{ tot = tot + red[q * {rpw}u + li]; }}
{store}  }}
}}
"""
"""The expert pass on subgroups: jobs (row, part) go by ``subgroup_id`` and lanes by their rank among the active
ones, as in linalg.GEMV_SG; whether the row's expert is in this shard (``hit``) travels to the storing thread
through ``hits``, written by the subgroup that did the row's part 0."""


def expert_source(mode: str, dec: Decoder, tpr: int, act: str, subgroups: bool = False) -> str:
    """The kernel of one pass (``gate``, ``up`` or ``down``) over a bank decoded by ``dec``; ``subgroups``: the
    :data:`EXPERT_SG` variant (the device must have the ``subgroup`` feature)."""
    outs = ("@group(0) @binding(4) var<storage, read_write> RW: array<f32>;\n"
            "@group(0) @binding(5) var<storage, read_write> Y: array<f32>;\n") if mode == "down" else \
        "@group(0) @binding(4) var<storage, read_write> G: array<f32>;\n"
    rowmap = _DOWN_MAP if mode == "down" else _GATE_UP_MAP
    if subgroups:
        return EXPERT_SG.format(mode=mode, dtype=dec.dtype.value, tpr=tpr, act=act if mode == "up" else "-",
                                outs=outs, lib=row_dot_wgsl(dec, tpr, 1, strided=True),
                                math=MATH if mode == "up" else "", wg=WG, rpw=WG // tpr,
                                rowmap=rowmap.replace("t, p.units)", "t, p.units, st)"),
                                store=_STORE[mode].format(act=ACT[act]).replace("red[li]", "tot"))
    return EXPERT.format(mode=mode, dtype=dec.dtype.value, tpr=tpr, act=act if mode == "up" else "-", outs=outs,
                         lib=row_dot_wgsl(dec, tpr, 1), math=MATH if mode == "up" else "", wg=WG,
                         rpw=WG // tpr, rowmap=rowmap,
                         reduce=reduce_wgsl(tpr, 1), store=_STORE[mode].format(act=ACT[act]))


def _pass(ctx: Lower, mode: str, bank: GpuWeight, x: Region, idx: str, k: int, rows: int, per: int, act: str,
          outs: list[Region]) -> None:
    """One GEMV pass over every expert shard of ``bank`` (rows of ``per`` features, each a dot over K = the
    bank's innermost dim with a row of ``x``)."""
    dec = decoder(bank.dtype, f"node {ctx.node!r} bank {bank.name!r}")
    inner = bank.shape[-1]
    if inner % UNIT:
        raise BackendError(f"[backend] webgpu: node {ctx.node!r}: bank {bank.name!r} rows hold {inner} values; the "
                           f"expert kernels need a multiple of {UNIT}")
    tpr = threads_per_row(inner // UNIT)
    src = expert_source(mode, dec, tpr, act, ctx.dev.subgroups)
    for n, s in enumerate(bank.shards):
        params = [rows, inner // UNIT, dec.dtype.nbytes(inner), bank.row_bytes, s.start, s.stop, k, per,
                  inner // 4, -(-rows // (WG // tpr)), int(n > 0), 0]
        ctx.dispatch(src, [s.region, x, ctx.region(idx), *outs], params, -(-rows // (WG // tpr)))


def experts(ctx: Lower, info: NodeInfo) -> None:
    """The three passes; each bank is fetched (``Lower.packed``) right before its own pass, because streamed
    weights share the staging buffers."""
    node = info.node
    x, w, idx, gate, up, down = node.inputs[:6]
    y = node.outputs[0]
    at = info.attrs
    k = int(at["top_k"])
    act = str(at.get("activation", "silu"))
    _, ff, d = ctx.shape(gate)
    tokens = ctx.count(x) // d
    g = ctx.scratch(tokens * k * ff * 4)
    xr = ctx.region(x)
    _pass(ctx, "gate", ctx.packed(gate), xr, idx, k, tokens * k * ff, ff, act, [g])
    _pass(ctx, "up", ctx.packed(up), xr, idx, k, tokens * k * ff, ff, act, [g])
    _pass(ctx, "down", ctx.packed(down), g, idx, k, tokens * d, d, act, [ctx.region(w), ctx.region(y)])


LOWERINGS: dict[str, Lowering] = {"MoERouter": router, "MoEExperts": experts, "MoEExpertsSwiGLU": experts}

__all__ = ["EXPERT_SG", "LOWERINGS", "expert_source", "experts", "router"]
