"""Command line of uaii-ir: validate, convert and show IR files.

    python -m uaii.ir validate FILE [--json]
    python -m uaii.ir convert IN OUT          (format by extension: .uaii.json/.json text, .uaii binary)
    python -m uaii.ir show FILE

Exit status: 0 ok, 1 error (unreadable file, bad arguments), 2 the graph is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence

from uaii.ir.errors import UaiiError
from uaii.ir.graph import Graph
from uaii.ir.serialize import load, save
from uaii.ir.validator import validate

EXIT_OK, EXIT_ERROR, EXIT_INVALID = 0, 1, 2


def _cmd_validate(args: argparse.Namespace) -> int:
    graph = load(args.file)
    diags = validate(graph)
    if args.json:
        report = {"file": args.file, "graph": graph.name, "valid": not diags,
                  "diagnostics": [{"code": str(d.code), "message": d.message, "node": d.node, "op": d.op,
                                   "graph": d.graph} for d in diags]}
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for d in diags:
            print(f"{d.code}: {d.message}")
        status = "valid" if not diags else f"invalid ({len(diags)} problem{'s' if len(diags) != 1 else ''})"
        print(f"{args.file}: graph '{graph.name}' {status}")
    return EXIT_OK if not diags else EXIT_INVALID


def _cmd_convert(args: argparse.Namespace) -> int:
    graph = load(args.input)
    save(graph, args.output)
    print(f"{args.input} -> {args.output}: {len(graph.nodes)} nodes, {len(graph.tensors)} tensors")
    return EXIT_OK


def describe(graph: Graph) -> str:
    """A human summary: header, inputs/outputs, op histogram, weights by dtype."""
    lines = [f"graph '{graph.name}'  ir {graph.ir_version[0]}.{graph.ir_version[1]}  producer '{graph.producer}'"
             f"  domain '{graph.domain}'"]
    for label, names in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        for n in names:
            t = graph.tensor_map.get(n)
            sig = f"{t.dtype.value}{list(t.shape)}" if t else "(undeclared)"
            lines.append(f"  {label[:-1]:6} {n}: {sig}")
    ops = Counter(n.op for n in graph.nodes)
    lines.append(f"  {len(graph.nodes)} nodes: " + ", ".join(f"{op}×{c}" for op, c in sorted(ops.items())))
    weights = graph.weights
    by_dtype = Counter(w.dtype.value for w in weights)
    lines.append(f"  {len(weights)} weights: " + ", ".join(f"{d}×{c}" for d, c in sorted(by_dtype.items())))
    for k, v in graph.metadata:
        lines.append(f"  meta {k} = {v}")
    return "\n".join(lines)


def _cmd_show(args: argparse.Namespace) -> int:
    print(describe(load(args.file)))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m uaii.ir", description="Validate, convert and show UAII IR files.")
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a graph against the op registry; exit 2 when invalid")
    v.add_argument("file")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_cmd_validate)
    c = sub.add_parser("convert", help="convert between .uaii.json/.json and .uaii (by extension)")
    c.add_argument("input")
    c.add_argument("output")
    c.set_defaults(func=_cmd_convert)
    s = sub.add_parser("show", help="summarize a graph")
    s.add_argument("file")
    s.set_defaults(func=_cmd_show)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors; our 2 means "invalid graph"
        return EXIT_OK if e.code == 0 else EXIT_ERROR
    try:
        return int(args.func(args))
    except (UaiiError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
