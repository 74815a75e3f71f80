"""The op registry: one :class:`~uaii.ir.ops.OpSchema` per (op, version), built-ins and plugins alike.

Providers register schemas. A provider is the built-in :func:`uaii.ir.ops.register` or any entry point of the
group ``uaii.ops`` in an installed distribution; both are loaded the same way, lazily, on the registry's first
use. An entry point's object may be

* a callable: called with the registry when it takes a parameter, else with no arguments; it may register
  schemas itself and/or return one schema or an iterable of schemas, which are registered;
* a module: its ``register`` function is used as above, or else its ``SCHEMAS`` iterable;
* an :class:`OpSchema` or an iterable of them.

A provider that fails to import, raises, returns something else or redefines an (op, version) that another
provider registered differently raises :class:`PluginError` naming the distribution and the entry point; the
discovery is then undone, so the next use retries and raises again.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable, Iterator
from importlib import metadata
from types import ModuleType
from typing import Any

from uaii.ir.errors import UaiiError
from uaii.ir.ops.schema import AttrSpec, OpSchema, Param, WeightAccess, fmt_types

ENTRY_POINT_GROUP = "uaii.ops"
BUILTIN_PROVIDER = "uaii.ir.ops:register"
BUILTIN_SOURCE = "the built-in ops of uaii-ir"


_RUNTIME_SOURCE = "register() at run time"


class RegistryError(UaiiError):
    component = "registry"


class UnknownOpError(RegistryError):
    """No schema for the requested (op, version)."""


class PluginError(RegistryError):
    """An op provider (entry point) could not be loaded."""

    def __init__(self, message: str, *, dist: str, entry_point: str) -> None:
        self.dist = dist
        self.entry_point = entry_point
        super().__init__(message)


class Registry:
    """Schemas keyed by (op, version). Thread-safe; discovery runs once, on first use."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, *, builtins: bool = True,
                 plugins: bool = True) -> None:
        self.group = group
        self._use_builtins = builtins
        self._use_plugins = plugins
        self._schemas: dict[tuple[str, int], OpSchema] = {}
        self._sources: dict[tuple[str, int], str] = {}
        self._manual: list[tuple[OpSchema, bool]] = []
        self._lock = threading.RLock()
        self._loaded = False
        self._source: str | None = None  # the provider being loaded, during discovery

    # --- registration --------------------------------------------------------------------------------------
    def register(self, schema: OpSchema, *, replace: bool = False) -> OpSchema:
        """Add a schema. Registering an equal schema again is a no-op; a different one for the same (op,
        version) raises unless ``replace``. Returns the schema, so it can wrap a definition."""
        if not isinstance(schema, OpSchema):
            raise RegistryError(f"register() takes an OpSchema, found {type(schema).__name__}")
        with self._lock:
            if self._source is not None:  # a provider registering during discovery
                self._add(schema, replace, self._source)
                return schema
            self._ensure_loaded()
            self._add(schema, replace, _RUNTIME_SOURCE)
            self._manual.append((schema, replace))
        return schema

    def _add(self, schema: OpSchema, replace: bool, source: str) -> None:
        key = schema.key
        old = self._schemas.get(key)
        if old is not None and old != schema and not replace:
            raise RegistryError(f"{schema.op} version {schema.version} is already registered by "
                                f"{self._sources[key]}; {source} registers a different schema for it")
        if old is None or old != schema:
            self._schemas[key] = schema
            self._sources[key] = source

    # --- discovery -----------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget discovered providers; the next use discovers again (after plugins come or go)."""
        with self._lock:
            self._schemas.clear()
            self._sources.clear()
            self._loaded = False

    def load(self) -> None:
        """Discover now rather than on first use; raises :class:`PluginError` for a broken provider."""
        with self._lock:
            self._ensure_loaded()

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._source is not None:
                return
            try:
                for dist, name, value, load, label in self._providers():
                    self._source = label
                    self._run_provider(load, dist, name, value)
                self._source = None
                for schema, replace in self._manual:
                    self._add(schema, replace, _RUNTIME_SOURCE)
            except BaseException:
                self._schemas.clear()
                self._sources.clear()
                raise
            finally:
                self._source = None
            self._loaded = True

    def _providers(self) -> Iterator[tuple[str, str, str, Any, str]]:
        """(distribution, entry point name, value, loader, source label) of each provider, built-ins first."""
        if self._use_builtins:
            yield "uaii-ir", "builtin", BUILTIN_PROVIDER, _load_builtins, BUILTIN_SOURCE
        if not self._use_plugins:
            return
        seen = {BUILTIN_PROVIDER, "uaii.ir.ops"}
        eps = sorted(metadata.entry_points(group=self.group), key=lambda e: (_dist_name(e), e.name))
        for ep in eps:
            if ep.value in seen:
                continue
            seen.add(ep.value)
            dist = _dist_name(ep)
            yield dist, ep.name, ep.value, ep.load, f"plugin {dist} (entry point {ep.name!r} = {ep.value!r})"

    def _run_provider(self, load: Any, dist: str, name: str, value: str) -> None:
        where = f"plugin {dist!r}, entry point {name!r} = {value!r} in group {self.group!r}"
        try:
            obj = load()
            for schema in self._call_provider(obj):
                self._add(schema, False, self._source or where)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"{where} failed: {type(exc).__name__}: {exc}", dist=dist,
                              entry_point=name) from exc

    def _call_provider(self, obj: Any) -> list[OpSchema]:
        if isinstance(obj, ModuleType):
            if callable(getattr(obj, "register", None)):
                obj = obj.register
            elif hasattr(obj, "SCHEMAS"):
                obj = obj.SCHEMAS
            else:
                raise RegistryError(f"module {obj.__name__} defines neither register() nor SCHEMAS")
        if callable(obj) and not isinstance(obj, OpSchema):
            obj = obj(self) if _takes_argument(obj) else obj()
        if obj is None:
            return []
        if not isinstance(obj, (OpSchema, Iterable)):
            raise RegistryError(f"expected OpSchema objects, found {type(obj).__name__}")
        items = [obj] if isinstance(obj, OpSchema) else list(obj)
        bad = [x for x in items if not isinstance(x, OpSchema)]
        if bad:
            raise RegistryError(f"expected OpSchema objects, found {type(bad[0]).__name__}")
        return items

    # --- lookups -------------------------------------------------------------------------------------------
    def find(self, op: str, version: int = 1) -> OpSchema | None:
        self._ensure_loaded()
        return self._schemas.get((str(op), version))

    def get(self, op: str, version: int = 1) -> OpSchema:
        schema = self.find(op, version)
        if schema is None:
            known = self.versions(op)
            hint = (f"; registered versions: {', '.join(map(str, known))}" if known
                    else "; no version of it is registered (is the plugin that defines it installed?)")
            raise UnknownOpError(f"unknown op {op!r} version {version}{hint}")
        return schema

    def versions(self, op: str) -> tuple[int, ...]:
        self._ensure_loaded()
        return tuple(sorted(v for o, v in self._schemas if o == op))

    def latest(self, op: str) -> OpSchema:
        known = self.versions(op)
        return self.get(op, known[-1] if known else 1)

    def source(self, op: str, version: int = 1) -> str:
        self.get(op, version)
        return self._sources[(op, version)]

    def schemas(self) -> tuple[OpSchema, ...]:
        self._ensure_loaded()
        return tuple(self._schemas[k] for k in sorted(self._schemas))

    def ops(self) -> tuple[str, ...]:
        return tuple(sorted({s.op for s in self.schemas()}))

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            return self.find(*key) is not None
        return isinstance(key, str) and bool(self.versions(key))

    def __iter__(self) -> Iterator[OpSchema]:
        return iter(self.schemas())

    def __len__(self) -> int:
        return len(self.schemas())


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(dist.name) if dist is not None else "<unknown distribution>"


def _takes_argument(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _load_builtins() -> Any:
    from uaii.ir import ops

    return ops.register


# --- the process-wide registry ----------------------------------------------------------------------------
_DEFAULT = Registry()


def default_registry() -> Registry:
    return _DEFAULT


def register(schema: OpSchema, *, replace: bool = False) -> OpSchema:
    """Register a schema in the process-wide registry."""
    return _DEFAULT.register(schema, replace=replace)


def get_schema(op: str, version: int = 1) -> OpSchema:
    return _DEFAULT.get(op, version)


def find_schema(op: str, version: int = 1) -> OpSchema | None:
    return _DEFAULT.find(op, version)


def refresh() -> None:
    """Rediscover the process-wide registry's providers on next use."""
    _DEFAULT.refresh()


# --- documentation ----------------------------------------------------------------------------------------
def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _params(schema: OpSchema, params: Iterable[Param]) -> str:
    out = []
    for p in params:
        mark = "..." if p.variadic else ("?" if p.optional else "")
        out.append(f"{p.name}{mark}: {p.types if isinstance(p.types, str) else fmt_types(p.types)}")
    return ", ".join(out) or "—"


def _props(s: OpSchema) -> str:
    flags = [f for f, on in (("elementwise", s.elementwise), ("fusible", s.fusible)) if on]
    flags += [f"in-place {i}→{o}" for i, o in s.inplace]
    if s.value_inputs:
        flags.append("shape from the values of " + ", ".join(s.inputs[i].name for i in s.value_inputs))
    if s.from_shape:
        flags.append("values from shapes")
    return ", ".join([*flags, f"cost {s.cost.name.lower()}"])


def _attr_row(a: AttrSpec) -> str:
    default = "required" if a.required else ("—" if a.default is None else repr(a.default))
    return f"| {a.name} | {a.type.value} | {_cell(default)} | {_cell(a.describe_range())} | {_cell(a.doc)} |"


def _section(s: OpSchema) -> list[str]:
    lines = [f"## {s.op} (version {s.version})", "", _cell(s.doc), ""]
    for title, params in (("Inputs", s.inputs), ("Outputs", s.outputs)):
        lines += [f"**{title}**", "", "| Name | Type | Description |", "|---|---|---|"]
        for p in params:
            mark = " (variadic)" if p.variadic else (" (optional)" if p.optional else "")
            types = p.types if isinstance(p.types, str) else fmt_types(p.types)
            lines.append(f"| {p.name}{mark} | {_cell(types)} | {_cell(p.doc)} |")
        lines.append("")
    if s.attrs:
        lines += ["**Attributes**", "", "| Name | Type | Default | Allowed | Description |",
                  "|---|---|---|---|---|"]
        lines += [_attr_row(a) for a in s.attrs] + [""]
    if s.type_map:
        lines += ["**Types**: " + "; ".join(f"{k} ∈ {fmt_types(v)}" for k, v in s.type_map.items()), ""]
    if s.weight_access:
        lines += ["**Weight access** (a weight in any other input is read whole): " + "; ".join(
            f"{s.inputs[slot].name}: {rule.value if isinstance(rule, WeightAccess) else rule}"
            for slot, rule in s.access_map.items()), ""]
    return lines


def render_markdown(registry: Registry | None = None, *, builtin_only: bool = False) -> str:
    """docs/ops.md: a summary table of every op, then one section per (op, version)."""
    reg = registry if registry is not None else _DEFAULT
    schemas = [s for s in reg.schemas() if not builtin_only or reg.source(s.op, s.version) == BUILTIN_SOURCE]
    lines = ["# UAII operators", "",
             "Generated from the op registry (`uaii.ir.registry.render_markdown`); do not edit by hand.", "",
             "| Op | Version | Kind | Inputs | Outputs | Planner |", "|---|---|---|---|---|---|"]
    for s in schemas:
        lines.append(f"| [{s.op}](#{s.op.lower()}-version-{s.version}) | {s.version} | {s.kind.value} | "
                     f"{_cell(_params(s, s.inputs))} | {_cell(_params(s, s.outputs))} | {_props(s)} |")
    lines.append("")
    for s in schemas:
        lines += _section(s)
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "BUILTIN_PROVIDER", "BUILTIN_SOURCE", "ENTRY_POINT_GROUP", "PluginError", "Registry", "RegistryError",
    "UnknownOpError", "default_registry", "find_schema", "get_schema", "refresh", "register",
    "render_markdown",
]
