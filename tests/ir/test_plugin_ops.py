"""Op plugins: a distribution built in tmp_path with a ``uaii.ops`` entry point, found as if installed."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from uaii.ir import DType, Graph, Node, Tensor, make_graph
from uaii.ir.registry import ENTRY_POINT_GROUP, PluginError, Registry, default_registry, refresh
from uaii.ir.validator import validate

FIXTURE = Path(__file__).parent / "plugin_fixture" / "uaii_demo_ops.py"


def make_dist(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str],
              group: str = ENTRY_POINT_GROUP) -> None:
    """Lay out an installed distribution: its modules plus a dist-info with METADATA and entry_points.txt."""
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\nRequires-Dist: uaii-ir\n"
    (info / "METADATA").write_text(meta)
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for the test's distributions; removed again and the registry refreshed."""
    path = tmp_path / "site"
    path.mkdir()
    sys.path.insert(0, str(path))
    importlib.invalidate_caches()
    yield path
    if str(path) in sys.path:
        sys.path.remove(str(path))
    prefix = str(path)
    for name in [n for n, m in sys.modules.items() if str(getattr(m, "__file__", None)).startswith(prefix)]:
        del sys.modules[name]
    importlib.invalidate_caches()
    refresh()


def scale_graph() -> Graph:
    t = [Tensor("x", DType.F32, ("seq", 8)), Tensor("y", DType.F32, ("seq", 8))]
    return make_graph("demo", [Node("scale", "DemoScale", ("x",), ("y",), {"factor": 2.0})], t, ["x"], ["y"])


def test_plugin_op_is_discovered_and_validates(site: Path) -> None:
    graph = scale_graph()
    assert [d.code for d in validate(graph)] == ["unknown-op"]
    make_dist(site, "uaii-demo-ops", {"demo": "uaii_demo_ops:register"},
              {"uaii_demo_ops": FIXTURE.read_text()})
    assert metadata.distribution("uaii-demo-ops").requires == ["uaii-ir"]
    refresh()
    assert validate(graph) == []
    assert default_registry().source("DemoScale") == "plugin uaii-demo-ops (entry point 'demo' = " \
                                                     "'uaii_demo_ops:register')"
    assert default_registry().find("MatMul") is not None  # built-ins sit beside the plugin


def test_discovery_is_lazy_and_accepts_every_provider_form(site: Path) -> None:
    reg = Registry(group="uaii.test_forms")  # created before the distribution exists
    mod = "from uaii_demo_ops import SCALE\nSCHEMAS = [SCALE]\n"
    make_dist(site, "uaii-demo-forms", {"fn": "uaii_demo_ops:schemas", "obj": "uaii_demo_ops:SCALE",
                                        "mod": "uaii_demo_mod"},
              {"uaii_demo_ops": FIXTURE.read_text(), "uaii_demo_mod": mod}, group="uaii.test_forms")
    assert reg.get("DemoScale").domain == "demo"
    assert validate(scale_graph(), reg) == []


def test_broken_plugin_names_distribution_and_entry_point(site: Path) -> None:
    make_dist(site, "uaii-broken-ops", {"broken": "uaii_broken_ops:register"},
              {"uaii_broken_ops": "raise RuntimeError('boom at import')\n"})
    refresh()
    for _ in range(2):  # discovery is undone on failure, so every use reports it again
        with pytest.raises(PluginError, match="boom at import") as e:
            validate(scale_graph())
        assert "plugin 'uaii-broken-ops', entry point 'broken'" in str(e.value)
        assert (e.value.dist, e.value.entry_point) == ("uaii-broken-ops", "broken")
    sys.path.remove(str(site))
    refresh()
    assert default_registry().find("MatMul") is not None


@pytest.mark.parametrize("source, match", [
    ("def register():\n    return 42\n", "expected OpSchema objects, found int"),
    ("from uaii.ir.ops import OpSchema\n"
     "def register(registry):\n    registry.register(OpSchema('MatMul', 1, 'impostor', (), ()))\n",
     "already registered by the built-in ops of uaii-ir"),
    ("X = 1\n", "has no attribute 'register'"),
])
def test_misbehaving_plugins(site: Path, source: str, match: str) -> None:
    make_dist(site, "uaii-bad-ops", {"bad": "uaii_bad_ops:register"}, {"uaii_bad_ops": source},
              group="uaii.test_bad")
    with pytest.raises(PluginError, match=match) as e:
        Registry(group="uaii.test_bad").find("MatMul")
    assert "uaii-bad-ops" in str(e.value)
