"""uaii.planner — fusion passes, the memory plan, the storage plan and the disk plan cache of UAII.

``plan(graph, options) -> (ExecutionPlan, cache_hit)`` is the entry point; ``summarize(plan)`` gives the storage
summary that ``uaii plan --json`` prints. See packages/uaii-planner/README.md and docs/planner.md.
"""

from importlib.metadata import version as _version

from uaii.planner.cache import CacheStatus, PlanCache, clear, status
from uaii.planner.check import plan_problems
from uaii.planner.errors import BudgetError, PlannerError
from uaii.planner.liveness import Interval, execution_order, live_intervals
from uaii.planner.memory import (
    ArenaPolicy,
    MemoryReport,
    assign_offsets,
    dim_bound,
    memory_report,
    overlapping_slots,
    plan_memory,
    state_values,
)
from uaii.planner.options import PlannerOptions
from uaii.planner.passes import (
    FusionPass,
    available_passes,
    default_passes,
    fuse_add_norm,
    fuse_glu,
    fuse_grouped_matmul,
    get_pass,
    register_pass,
    run_passes,
)
from uaii.planner.pipeline import LayerCut, PipelineStage, choose_split, layer_cuts, split_graph
from uaii.planner.planner import build_plan, fuse, plan, plan_key
from uaii.planner.steps import Placement, kernel_id, make_steps
from uaii.planner.storage import (
    WEIGHT_GROUP_RULES,
    WeightUse,
    group_of,
    plan_storage,
    storage_for_uses,
    summarize,
    weight_group,
    weight_uses,
    window_bytes,
)

__version__ = _version("uaii-planner")
__all__ = [
    "WEIGHT_GROUP_RULES",
    "ArenaPolicy",
    "BudgetError",
    "CacheStatus",
    "FusionPass",
    "Interval",
    "LayerCut",
    "MemoryReport",
    "PipelineStage",
    "Placement",
    "PlanCache",
    "PlannerError",
    "PlannerOptions",
    "WeightUse",
    "__version__",
    "assign_offsets",
    "available_passes",
    "build_plan",
    "choose_split",
    "clear",
    "default_passes",
    "dim_bound",
    "execution_order",
    "fuse",
    "fuse_add_norm",
    "fuse_glu",
    "fuse_grouped_matmul",
    "get_pass",
    "group_of",
    "kernel_id",
    "layer_cuts",
    "live_intervals",
    "make_steps",
    "memory_report",
    "overlapping_slots",
    "plan",
    "plan_key",
    "plan_memory",
    "plan_problems",
    "plan_storage",
    "register_pass",
    "run_passes",
    "split_graph",
    "state_values",
    "status",
    "storage_for_uses",
    "summarize",
    "weight_group",
    "weight_uses",
    "window_bytes",
]
