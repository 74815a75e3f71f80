"""``uaii inspect``: what a model is — architecture, metadata, tensors and their types, memory it needs.

Reads the model through ``uaii.loaders.load_model`` (header and tensor table only; no weight is read).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from math import prod
from typing import Any

from rich.table import Table

from . import report
from .context import Context, add_model_argument, model_path

_LAYER = re.compile(r"(^|\.)(blk|layers|h|layer)\.(\d+)\.")
_CONFIG_KEYS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "context_length",
                "activation", "sliding_window", "n_experts", "n_experts_used", "tied_embeddings")


def add_parsers(sub: Any) -> None:
    ap = sub.add_parser("inspect", help="architecture, metadata, tensor types and memory estimate of a model")
    add_model_argument(ap)
    ap.add_argument("--all", action="store_true", help="every tensor and every metadata key (default: a summary)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.set_defaults(func=cmd_inspect)


# ----------------------------------------------------------------------------------------------- the numbers
def distinct_tensors(weights: Mapping[str, Any]) -> list[Any]:
    """TensorInfos with every byte counted once: expert slices inside a packed bank are left out."""
    infos = sorted(weights.values(), key=lambda i: (i.file, i.offset, -i.nbytes))
    kept: list[Any] = []
    file, end = None, -1
    for info in infos:
        if info.file == file and info.offset + info.nbytes <= end:
            continue  # inside the previous tensor (an expert of its bank)
        kept.append(info)
        file, end = info.file, max(end if info.file == file else -1, info.offset + info.nbytes)
    return kept


def quant_mix(infos: Iterable[Any]) -> dict[str, dict[str, int]]:
    """dtype name (``Q4_1``, ``F32``) → tensor count, bytes and elements."""
    mix: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0, "params": 0})
    for info in infos:
        row = mix[info.dtype.name]
        row["count"] += 1
        row["bytes"] += int(info.nbytes)
        row["params"] += int(prod(info.shape))
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))


def kv_bytes(cfg: Any, tokens: int, bytes_per_value: int) -> int:
    """K and V of ``tokens`` positions over all layers; sliding-window layers hold at most their window."""
    per_token = 2 * cfg.n_kv_heads * cfg.head_dim * bytes_per_value
    sliding = tuple(cfg.sliding_layers) or (False,) * cfg.n_layers
    window = cfg.sliding_window or tokens
    return sum(per_token * (min(tokens, window) if s else tokens) for s in sliding)


def role_of(name: str) -> tuple[str, int | None]:
    """``blk.7.attn_q.weight`` → (``blk.*.attn_q.weight``, 7); other names keep their text and no layer."""
    m = _LAYER.search(name)
    if m is None:
        return name, None
    return name[:m.start(3)] + "*" + name[m.end(3):], int(m.group(3))


def tensor_groups(infos: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per tensor role (layers folded together): dtype(s), shape, count, bytes."""
    groups: dict[str, dict[str, Any]] = {}
    for info in infos:
        role, _ = role_of(info.name)
        g = groups.setdefault(role, {"name": role, "dtypes": Counter(), "shape": list(info.shape), "count": 0,
                                     "bytes": 0})
        g["dtypes"][info.dtype.name] += 1
        g["count"] += 1
        g["bytes"] += int(info.nbytes)
    rows = []
    for g in groups.values():
        g["dtypes"] = dict(g["dtypes"])
        rows.append(g)
    return rows


def scalar_metadata(meta: Mapping[str, Any], *, everything: bool) -> dict[str, Any]:
    """Metadata for display: scalars as they are, arrays as ``[N items]``; the summary keeps general.* keys."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not everything and not key.startswith(("general.", "tokenizer.ggml.model", "tokenizer.ggml.pre")):
            continue
        if isinstance(value, str | int | float | bool):
            text = value if not isinstance(value, str) or len(value) <= 200 else value[:200] + "…"
            out[key] = text
        elif hasattr(value, "__len__"):
            out[key] = f"[{len(value)} items]"
        else:
            out[key] = str(value)
    return out


def describe(model: Any, *, everything: bool = False) -> dict[str, Any]:
    """Everything ``inspect`` shows, as plain data (the ``--json`` object)."""
    cfg = model.config
    infos = distinct_tensors(model.weights)
    weight_bytes = sum(int(i.nbytes) for i in infos)
    n_params = sum(int(prod(i.shape)) for i in infos)
    obj: dict[str, Any] = {
        "path": str(model.path),
        "format": model.format,
        "name": model.graph.name,
        "architecture": cfg.architecture,
        "n_params": n_params,
        "config": {k: getattr(cfg, k) for k in _CONFIG_KEYS},
        "rope": asdict(cfg.rope) if cfg.rope is not None else None,
        "chat_template": model.chat_template is not None,
        "graph": {"nodes": len(model.graph.nodes), "tensors": len(model.graph.tensors)},
        "quant_mix": quant_mix(infos),
        "n_tensors": len(infos),
        "memory": {"weights_bytes": weight_bytes, "kv_bytes_per_1k_tokens_f32": kv_bytes(cfg, 1024, 4),
                   "kv_bytes_per_1k_tokens_f16": kv_bytes(cfg, 1024, 2)},
        "metadata": scalar_metadata(model.source_metadata, everything=everything),
        "import_notes": str(model.source_metadata.get("onnx.import_notes", "")).splitlines(),
    }
    if everything:
        obj["tensors"] = [{"name": i.name, "dtype": i.dtype.name, "shape": list(i.shape), "bytes": int(i.nbytes),
                           "offset": int(i.offset)} for i in sorted(infos, key=lambda i: i.offset)]
    else:
        obj["tensor_groups"] = tensor_groups(infos)
    return obj


# ------------------------------------------------------------------------------------------------- rendering
def render(ctx: Context, d: Mapping[str, Any]) -> None:
    out = ctx.out
    out.print(f"[bold]{d['name']}[/bold]  {d['architecture']} · {d['n_params'] / 1e6:.1f} M parameters · "
              f"{d['format']} · {d['path']}", highlight=False, soft_wrap=True)
    cfg = Table(title="architecture", show_header=False, title_justify="left")
    cfg.add_column("key")
    cfg.add_column("value")
    for k, v in d["config"].items():
        cfg.add_row(k, str(v))
    if d["rope"]:
        cfg.add_row("rope", f"theta {d['rope']['theta']:g}, dims {d['rope']['dims']}, {d['rope']['mode']}, "
                            f"scaling {d['rope']['scaling']}")
    cfg.add_row("chat template in the file", "yes" if d["chat_template"] else "no (the tokenizer may know one)")
    cfg.add_row("IR graph", f"{d['graph']['nodes']} nodes, {d['graph']['tensors']} tensors")
    out.print(cfg)
    if d["metadata"]:
        meta = Table(title="metadata", show_header=False, title_justify="left")
        meta.add_column("key")
        meta.add_column("value", overflow="fold")
        for k, v in d["metadata"].items():
            meta.add_row(k, str(v))
        out.print(meta)
    for note in d["import_notes"]:  # what a translated graph approximates or ignores (ONNX import)
        out.print(f"[yellow]import note:[/yellow] {note}", highlight=False, soft_wrap=True)
    mix = Table(title="quant mix", title_justify="left")
    for col in ("type", "tensors", "parameters", "bytes", "share"):
        mix.add_column(col, justify="left" if col == "type" else "right")
    total = d["memory"]["weights_bytes"] or 1
    for name, row in d["quant_mix"].items():
        mix.add_row(name, str(row["count"]), f"{row['params']:,}", report.size(row["bytes"]),
                    f"{row['bytes'] / total:.1%}")
    out.print(mix)
    _render_tensors(ctx, d)
    mem = d["memory"]
    out.print(f"memory: weights {report.size(mem['weights_bytes'])} · KV cache per 1k tokens "
              f"{report.size(mem['kv_bytes_per_1k_tokens_f32'])} (f32), "
              f"{report.size(mem['kv_bytes_per_1k_tokens_f16'])} (f16)", highlight=False, soft_wrap=True)


def _render_tensors(ctx: Context, d: Mapping[str, Any]) -> None:
    if "tensors" in d:
        t = Table(title=f"tensors ({len(d['tensors'])})", title_justify="left")
        for col in ("name", "type", "shape", "bytes", "offset"):
            t.add_column(col, justify="right" if col in ("bytes", "offset") else "left")
        for row in d["tensors"]:
            t.add_row(row["name"], row["dtype"], "×".join(map(str, row["shape"])), f"{row['bytes']:,}",
                      f"{row['offset']:#x}")
    else:
        t = Table(title=f"tensors ({d['n_tensors']}; per role, layers folded; --all lists each)",
                  title_justify="left")
        for col in ("tensor", "type", "shape", "count", "bytes"):
            t.add_column(col, justify="right" if col in ("count", "bytes") else "left")
        for row in d["tensor_groups"]:
            types = ", ".join(f"{k}×{v}" if len(row["dtypes"]) > 1 else k for k, v in row["dtypes"].items())
            t.add_row(row["name"], types, "×".join(map(str, row["shape"])), str(row["count"]),
                      report.size(row["bytes"]))
    ctx.out.print(t)


def cmd_inspect(args: argparse.Namespace, ctx: Context) -> int:
    from uaii.loaders import load_model

    path = model_path(args.model)
    with ctx.status(f"reading {path.name} ..."):
        model = load_model(path)
    d = describe(model, everything=args.all)
    if args.json:
        report.print_json(d)
    else:
        render(ctx, d)
    return 0


__all__ = ["add_parsers", "cmd_inspect", "describe", "distinct_tensors", "kv_bytes", "quant_mix", "role_of"]
