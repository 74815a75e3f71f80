"""Generate the ONNX loader's test fixtures (issue #14) and their onnxruntime references.

    uv run --no-sync python scripts/onnx_fixtures.py [--out DIR] [--only NAME|GLOB ...] [--jobs N] [--list]

Default output: ``$UAII_CACHE_DIR/onnx-fixtures/<key>`` (``~/.cache/uaii`` when unset), key = sha256 of the
generator's sources and the versions of every reference package, so a changed script or a changed onnxruntime
makes a new set. Generation is idempotent (a directory with a manifest.json is complete: nothing is done) and atomic
(everything is written into a temporary sibling directory that is renamed into place at the end; a concurrent
generator that loses the race throws its copy away).

Layout: ``<dir>/manifest.json`` and one folder per fixture (``<name>/model.onnx`` [+ external data],
``inputs.npz``, ``outputs.npz``, ``tokenizer.json`` + ``tokenizer_config.json`` for the causal models).
manifest.json is ``{"version": 1, "key": ..., "versions": {package: version}, "fixtures": [entry, ...]}``;
an entry is::

    name        fixture name (fixed: other tests refer to it)
    file        the .onnx, relative to <dir>
    kind        "forward"    run the graph once, compare every output
                "causal"     a causal LM without KV I/O: "forward" + greedy (full forward each step)
                "causal-kv"  a causal LM with KV I/O: outputs of the prefill (past length 0) + greedy
                             (prefill, then one token a step with the presents fed back)
    exporter    torch-dynamo | torch-legacy | torch-legacy-optimum | onnxruntime-genai-builder | onnx-helper
    opset       the ai.onnx opset the model imports ("opsets": every domain -> version)
    inputs      .npz of the inputs (batch 1), by graph input name
    outputs     .npz of onnxruntime's outputs on them (CPU provider, default options, 1 thread), by output name
    tolerance   |actual - expected| <= tolerance * (1 + |expected|) elementwise, i.e. numpy's allclose with
                rtol = atol = tolerance (1e-4 for f32; quantized ones say how it was measured in tolerance_note)
    greedy      (causal kinds) {prompt_text, prompt_ids, tokens, margins}: onnxruntime's greedy continuation,
                steps fixed (no stop at EOS); margins = top-1 minus top-2 logit per step (a tiny margin is a
                near-tie, where a 1e-5 difference may legitimately pick the other token)
    tokenizer   true when tokenizer.json / tokenizer_config.json lie beside the model
    kv          (causal-kv) {layers, kv_heads, head_dim, past: [names], present: [names], layout, position_ids}
    reference_f32  (models with MatMulNBits at accuracy_level 4) {outputs, tolerance, greedy?, note}: onnxruntime
                at accuracy_level 0 (f32 dequantization), for an implementation that keeps activations in f32
    checker_note   why onnx.checker needed help (an op onnxruntime registers in the ai.onnx domain)
    note        what else is special about the fixture
    ops         op histogram {domain ("" = ai.onnx): {op_type: count}}
    bytes       size of the fixture's files

Every exported model is checked against torch on the same inputs (1e-4) before onnxruntime's outputs become its
reference, and causal ones again at the full greedy length (dynamic axes that were really dynamic).
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCES = ("onnx_fixtures.py", "onnx_fixtures_torch.py", "onnx_fixtures_graphs.py")
REFERENCES = ("numpy", "onnx", "onnxruntime", "onnxscript", "onnxruntime-genai", "torch", "transformers",
              "tokenizers")
F32_TOLERANCE = 1e-4
GREEDY_STEPS = 8
MANIFEST = "manifest.json"
ENTRIES = ".entries"


# --- the fixtures --------------------------------------------------------------------------------------------------
def _sibling(name: str) -> ModuleType:
    """scripts/<name>.py as a module (scripts/ is not a package; the tests load this file by path)."""
    key = f"uaii_scripts_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def _torch() -> ModuleType:
    return _sibling("onnx_fixtures_torch")


def _kv_optimum(arch: str, dest: Path) -> dict[str, Any]:
    return dict(_torch().build_kv_optimum(arch, dest))


def _genai(arch: str, dest: Path) -> dict[str, Any]:
    return dict(_torch().build_genai(arch, dest))


_ARCHS = ("llama", "qwen2", "gemma3", "gpt2", "bert", "mixtral")


def _registry() -> dict[str, tuple[str, float, Callable[[Path], dict[str, Any]]]]:
    """name -> (group, estimated CPU seconds, builder). A group is built in one process (it shares an import of torch
    and, for external-unaligned, llama-legacy's export)."""
    graphs = _sibling("onnx_fixtures_graphs")

    def export(arch: str, exporter: str) -> Callable[[Path], dict[str, Any]]:
        return lambda dest: _torch().build_export(arch, exporter, dest)

    reg: dict[str, tuple[str, float, Callable[[Path], dict[str, Any]]]] = {}
    for arch in _ARCHS:
        reg[f"{arch}-dynamo"] = (arch, 30.0 if arch == "mixtral" else 18.0, export(arch, "dynamo"))
        reg[f"{arch}-legacy"] = (arch, 4.0, export(arch, "legacy"))
    for arch in ("llama", "qwen2"):
        reg[f"{arch}-kv-optimum"] = (arch, 5.0, functools.partial(_kv_optimum, arch))
        reg[f"genai-{arch}-int4"] = ("genai", 8.0, functools.partial(_genai, arch))
    reg["external-unaligned"] = ("llama", 4.0, lambda d: graphs.build_external_unaligned(
        lambda tmp: _torch().build_export("llama", "legacy", tmp), d))
    for name, build in graphs.OPS.items():
        reg[name] = ("graphs", 0.3, build)
    return reg


def fixture_names() -> list[str]:
    return list(_registry())


def select(patterns: list[str] | None) -> list[str]:
    """The fixture names matching ``patterns`` (names or globs), in registry order; every pattern must match."""
    names = fixture_names()
    if not patterns:
        return names
    unknown = [p for p in patterns if not fnmatch.filter(names, p)]
    if unknown:
        raise ValueError(f"onnx_fixtures: no fixture matches {unknown}; --list shows them")
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


# --- cache key and directory ---------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    out = {}
    for pkg in REFERENCES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def cache_key(names: list[str] | None = None) -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update((HERE / src).read_bytes())
    h.update(json.dumps(versions(), sort_keys=True).encode())
    if names is not None and names != fixture_names():
        h.update(("\n".join(names)).encode())
    return h.hexdigest()[:16]


def default_dir(names: list[str] | None = None) -> Path:
    base = Path(os.environ.get("UAII_CACHE_DIR") or Path.home() / ".cache" / "uaii")
    return base / "onnx-fixtures" / cache_key(names)


# --- onnxruntime ---------------------------------------------------------------------------------------------------
def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_run(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def _margin(logits: np.ndarray) -> float:
    top2 = np.sort(logits.astype(np.float64))[-2:]
    return float(top2[1] - top2[0])


def greedy_full(session: Any, prompt: list[int], steps: int = GREEDY_STEPS) -> tuple[list[int], list[float]]:
    """Greedy decoding by running the whole sequence through the model at every step (no KV I/O)."""
    ids, tokens, margins = list(prompt), [], []
    for _ in range(steps):
        x = np.asarray([ids], dtype=np.int64)
        logits = ort_run(session, {"input_ids": x, "attention_mask": np.ones_like(x)})["logits"][0, -1]
        tok = int(np.argmax(logits))
        tokens.append(tok)
        margins.append(_margin(logits))
        ids.append(tok)
    return tokens, margins


def greedy_kv(session: Any, prompt: list[int], kv: dict[str, Any],
              steps: int = GREEDY_STEPS) -> tuple[list[int], list[float]]:
    """Greedy decoding the way an Optimum / onnxruntime-genai model runs: prefill with an empty past, then one
    token a step with the presents fed back as the past."""
    past = {n: np.zeros((1, kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32) for n in kv["past"]}
    new, pos, tokens, margins = list(prompt), 0, [], []
    for _ in range(steps):
        x = np.asarray([new], dtype=np.int64)
        feeds = {"input_ids": x, "attention_mask": np.ones((1, pos + len(new)), dtype=np.int64), **past}
        if kv["position_ids"]:
            feeds["position_ids"] = np.arange(pos, pos + len(new), dtype=np.int64)[None]
        out = ort_run(session, feeds)
        logits = out["logits"][0, -1]
        tok = int(np.argmax(logits))
        tokens.append(tok)
        margins.append(_margin(logits))
        past = {p: out[q] for p, q in zip(kv["past"], kv["present"], strict=True)}
        pos += len(new)
        new = [tok]
    return tokens, margins


# --- checks --------------------------------------------------------------------------------------------------------
def assert_close(name: str, what: str, actual: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                 tol: float) -> None:
    for key, exp in expected.items():
        got = actual[key]
        if got.shape != exp.shape or not np.allclose(got, exp, rtol=tol, atol=tol, equal_nan=True):
            diff = np.max(np.abs(got.astype(np.float64) - exp)) if got.shape == exp.shape else "shape"
            raise RuntimeError(f"{name}: onnxruntime and {what} disagree on {key!r}: {got.shape} vs {exp.shape}, "
                               f"max |diff| {diff} (tolerance {tol})")


def op_histogram(path: Path) -> dict[str, dict[str, int]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts: Counter[tuple[str, str]] = Counter()
    stack = [model.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            counts[(node.domain if node.domain != "ai.onnx" else "", node.op_type)] += 1
            stack.extend(a.g for a in node.attribute if a.HasField("g"))
            stack.extend(g for a in node.attribute for g in a.graphs)
    out: dict[str, dict[str, int]] = {}
    for (domain, op), n in sorted(counts.items()):
        out.setdefault(domain, {})[op] = n
    return out


def _opsets(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


# ops onnxruntime registers in the ai.onnx domain although onnx does not define them there: the genai builder emits
# SimplifiedLayerNormalization with domain "" (its Skip- variant and the others with com.microsoft)
ORT_ONNX_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def check_model(path: Path) -> str | None:
    """onnx.checker on the file (by path, so external data is checked where it lies). A model that fails only
    because it uses ORT_ONNX_DOMAIN_OPS in the ai.onnx domain is checked again with those nodes moved to
    com.microsoft, and the returned note says so; any other failure raises."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
        return None
    except onnx.checker.ValidationError as exc:
        model = onnx.load(str(path), load_external_data=False)
        used = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")} & ORT_ONNX_DOMAIN_OPS)
        if not used or not any(f"No Op registered for {op} " in str(exc) for op in used):
            raise
    for node in model.graph.node:
        if node.op_type in ORT_ONNX_DOMAIN_OPS and node.domain in ("", "ai.onnx"):
            node.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    moved = path.with_name(f".{path.stem}.checked.onnx")  # beside it: external data resolves the same way
    try:
        onnx.save(model, str(moved))
        onnx.checker.check_model(str(moved))
    finally:
        moved.unlink(missing_ok=True)
    return (f"{', '.join(used)} in the ai.onnx domain (onnxruntime registers it there, onnx does not define it): "
            f"the checker passes with those nodes in com.microsoft")


# --- quantized models: how far onnxruntime's int8-activation path is from f32 dequantization -----------------------
def _with_accuracy_level(src: Path, level: int) -> Path:
    """A copy of ``src`` (beside it, sharing its external data) whose MatMulNBits nodes compute at ``level``
    (0: dequantize to f32 and multiply in f32)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = level
    out = src.with_name(f".{src.stem}.level{level}.onnx")
    onnx.save(model, str(out))
    return out


def _round_up(x: float) -> float:
    """``x`` rounded up to one significant digit (0.00123 -> 0.002)."""
    if x <= 0:
        return 0.0
    exp = math.floor(math.log10(x))
    return float(f"{math.ceil(round(x / 10.0**exp, 9))}e{exp}")


def _quantized_reference(entry_dir: Path, name: str, built: dict[str, Any],
                         outputs: dict[str, np.ndarray]) -> tuple[float, str, dict[str, Any]]:
    """The tolerance of a model with MatMulNBits at accuracy_level 4, and the same model's references at
    accuracy_level 0 (onnxruntime dequantizes to f32 and multiplies in f32) for implementations that do that."""
    path = _with_accuracy_level(entry_dir / built["file"], 0)
    try:
        session = ort_session(path)
        f32 = ort_run(session, built["inputs"])
        greedy = None
        if built["kind"] == "causal-kv":
            greedy = greedy_kv(session, [int(t) for t in built["inputs"]["input_ids"][0]], built["kv"])
    finally:
        path.unlink()
    diff = max(float(np.max(np.abs(f32[k] - v))) for k, v in outputs.items())
    rel = max(float(np.max(np.abs(f32[k] - v) / (1 + np.abs(v)))) for k, v in outputs.items())
    # a second implementation may sit on either side of onnxruntime (f32 dequantization, or its own 8-bit
    # activations): twice the measured distance, in the manifest's |a - b| <= tol * (1 + |b|), rounded up
    tol = max(F32_TOLERANCE, _round_up(2 * rel))
    note = (f"MatMulNBits accuracy_level 4 (onnxruntime quantizes the activations to int8 per block): measured "
            f"onnxruntime vs onnxruntime at accuracy_level 0 (f32 dequantization): max |diff| {diff:.3g}, "
            f"max |diff| / (1 + |ref|) {rel:.3g}; tolerance = 2x the latter, rounded up")
    _save_npz(entry_dir / "outputs_f32.npz", f32)
    ref: dict[str, Any] = {"outputs": f"{name}/outputs_f32.npz", "tolerance": F32_TOLERANCE,
                           "note": "onnxruntime on the same model with every MatMulNBits at accuracy_level 0 "
                                   "(dequantize to f32, multiply in f32): the reference of an implementation that "
                                   "does not quantize the activations"}
    if greedy is not None:
        ref["greedy"] = {"tokens": greedy[0], "margins": [round(m, 6) for m in greedy[1]]}
    return tol, note, ref


# --- one fixture ---------------------------------------------------------------------------------------------------
def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    savez: Any = np.savez  # numpy's stub types the keyword arrays as its own flags
    with path.open("wb") as fh:
        savez(fh, **arrays)


def build_one(root: Path, name: str) -> dict[str, Any]:
    """Build fixture ``name`` into ``root/name`` and return its manifest entry."""
    builder = _registry()[name][2]
    dest = root / name
    dest.mkdir(parents=True)
    built = builder(dest)
    model_path = dest / built["file"]
    checker_note = check_model(model_path)
    session = ort_session(model_path)
    outputs = ort_run(session, built["inputs"])
    tol = float(built.get("tolerance", F32_TOLERANCE))
    if built.get("expected"):
        assert_close(name, built.get("expected_from", "torch"), outputs, built["expected"], tol)
    entry: dict[str, Any] = {"name": name, "file": f"{name}/{built['file']}", "kind": built["kind"],
                             "exporter": built["exporter"]}
    opsets = _opsets(model_path)
    entry.update(opset=opsets.get("", 0), opsets=opsets, inputs=f"{name}/inputs.npz", outputs=f"{name}/outputs.npz")
    if built["kind"] in ("causal", "causal-kv"):
        entry["greedy"] = _greedy_reference(name, session, built, tol)
    if built.get("quantized"):
        tol, entry["tolerance_note"], entry["reference_f32"] = _quantized_reference(dest, name, built, outputs)
    entry["tolerance"] = tol
    if built.get("tolerance_note") and "tolerance_note" not in entry:
        entry["tolerance_note"] = built["tolerance_note"]
    entry["tokenizer"] = bool(built.get("tokenizer"))
    if "kv" in built:
        entry["kv"] = built["kv"]
    if "note" in built:
        entry["note"] = built["note"]
    if checker_note:
        entry["checker_note"] = checker_note
    _save_npz(dest / "inputs.npz", built["inputs"])
    _save_npz(dest / "outputs.npz", outputs)
    entry["ops"] = op_histogram(model_path)
    entry["bytes"] = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    return entry


def _greedy_reference(name: str, session: Any, built: dict[str, Any], tol: float) -> dict[str, Any]:
    """onnxruntime's greedy continuation of the prompt (the inputs' ids), and torch's logits at its full length."""
    prompt = [int(t) for t in built["inputs"]["input_ids"][0]]
    if built["kind"] == "causal":
        tokens, margins = greedy_full(session, prompt)
    else:
        tokens, margins = greedy_kv(session, prompt, built["kv"])
    last = built.get("torch_last_logits")
    if last is not None:  # the whole greedy sequence at once: the exported axes really are dynamic
        seq = np.asarray([prompt + tokens[:-1]], dtype=np.int64)
        got = ort_run(session, _full_feeds(built, seq))["logits"][0, -1]
        assert_close(name, "torch at the full greedy length", {"logits": got}, {"logits": last(seq)}, tol)
    return {"prompt_text": built.get("prompt_text"), "prompt_ids": prompt, "tokens": tokens,
            "margins": [round(m, 6) for m in margins]}


def _full_feeds(built: dict[str, Any], seq: np.ndarray) -> dict[str, np.ndarray]:
    """Feeds that run ``seq`` as one prefill (an empty past for KV models)."""
    feeds: dict[str, np.ndarray] = {"input_ids": seq, "attention_mask": np.ones_like(seq)}
    kv = built.get("kv")
    if kv:
        feeds["position_ids"] = np.arange(seq.shape[1], dtype=np.int64)[None]
        feeds.update({n: np.zeros((1, kv["kv_heads"], 0, kv["head_dim"]), dtype=np.float32) for n in kv["past"]})
    return feeds


def _worker(root: Path, names: list[str]) -> None:
    """Build ``names`` into ``root``; each entry lands in root/.entries/<name>.json."""
    (root / ENTRIES).mkdir(exist_ok=True)
    for name in names:
        cpu, wall = time.process_time(), time.time()
        entry = build_one(root, name)
        (root / ENTRIES / f"{name}.json").write_text(json.dumps(entry))
        print(f"  {name}: {time.time() - wall:.1f} s ({time.process_time() - cpu:.1f} s CPU)", file=sys.stderr,
              flush=True)


# --- the whole set -------------------------------------------------------------------------------------------------
def _partition(names: list[str], jobs: int) -> list[list[str]]:
    """Groups spread over ``jobs`` processes, the most expensive first onto the least loaded."""
    reg = _registry()
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(reg[n][0], []).append(n)
    cost = {g: sum(reg[n][1] for n in ns) for g, ns in groups.items()}
    bins: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(max(1, jobs))]
    for g in sorted(groups, key=lambda g: -cost[g]):
        i = min(range(len(bins)), key=lambda i: bins[i][0])
        bins[i] = (bins[i][0] + cost[g], bins[i][1] + groups[g])
    return [b for _, b in bins if b]


def generate(out: Path | None = None, only: list[str] | None = None, jobs: int = 2) -> Path:
    """Generate the fixtures into ``out`` (default: the cache directory of this generator and these references)
    unless it already holds a manifest; return the directory."""
    names = select(only)
    target = out if out is not None else default_dir(names)
    if (target / MANIFEST).is_file():
        return target
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"onnx_fixtures: {target} exists without a {MANIFEST}: not overwriting it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        parts = _partition(names, jobs)
        if len(parts) == 1:
            _worker(tmp, parts[0])
        else:
            procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(tmp),
                                       *part]) for part in parts]
            failed = [p.args for p in procs if p.wait() != 0]
            if failed:
                raise RuntimeError(f"onnx_fixtures: {len(failed)} worker(s) failed (their errors are above)")
        entries = [json.loads((tmp / ENTRIES / f"{n}.json").read_text()) for n in names]
        shutil.rmtree(tmp / ENTRIES)
        manifest = {"version": 1, "key": target.name, "versions": versions(), "fixtures": entries}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            if target.exists():
                target.rmdir()  # empty: ours to replace
            os.rename(tmp, target)
        except OSError:
            if not (target / MANIFEST).is_file():
                raise
            shutil.rmtree(tmp)  # a concurrent generator finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)  # the worker's share
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: the cache)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fixture names or globs (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--list", action="store_true", help="print the fixture names and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(fixture_names()))
        return 0
    if args.worker:
        _worker(args.out, args.names)
        return 0
    start = time.time()
    try:
        out = generate(args.out, args.only, args.jobs)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{out}  ({time.time() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
