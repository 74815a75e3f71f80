"""``uaii_convert_model``: any model the loaders read (or an IR file) written as UAII IR.

Weights are never copied: the output keeps weight references, rewritten relative to the output's directory so
that they still name the same files. The output is written atomically (uaii.ir.save).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from uaii.capi.irmodel import is_ir_path
from uaii.capi.status import CapiError, Status
from uaii.ir import Graph, WeightRef


def rebase(graph: Graph, base: Path, out_dir: Path) -> Graph:
    """``graph`` with relative weight references re-expressed relative to ``out_dir``."""
    if base.resolve() == out_dir.resolve():
        return graph
    tensors = []
    for t in graph.tensors:
        ref = t.weight
        if ref is not None and not os.path.isabs(ref.path):
            path = os.path.relpath(base.resolve() / ref.path, out_dir.resolve())
            t = dataclasses.replace(t, weight=WeightRef(path, ref.tensor, ref.expert))
        tensors.append(t)
    return dataclasses.replace(graph, tensors=tuple(tensors))


def convert_model(input_path: str, output_path: str) -> None:
    from uaii.ir import load, save
    from uaii.ir.serialize import file_format

    try:
        file_format(output_path)
    except Exception as exc:
        raise CapiError(Status.ERR_INVALID_ARGUMENT, str(exc)) from None
    source = Path(input_path)
    if not source.exists():
        raise CapiError(Status.ERR_NOT_FOUND, f"model {input_path!r}: no such file or directory")
    out_dir = Path(output_path).absolute().parent
    if not out_dir.is_dir():
        raise CapiError(Status.ERR_IO, f"cannot write {output_path!r}: directory {str(out_dir)!r} does not exist")
    if is_ir_path(input_path):
        graph, base = load(source), source.absolute().parent
    else:
        from uaii.loaders import load_model

        model = load_model(source)
        graph, base = model.graph, Path(model.base_dir)
    save(rebase(graph, base, out_dir), output_path)
