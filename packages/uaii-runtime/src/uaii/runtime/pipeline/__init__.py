"""Pipeline-parallel decoding: the decoder's layers as K stages, each on its own node with its own memory budget.

``Session(model, pipeline=K)`` builds one :class:`~uaii.runtime.pipeline.stage.StageRunner` per stage (a Ray actor
per node, or all in this process with ``pipeline_transport="local"``), chooses where the stages begin from the
budgets the stages report (:func:`uaii.planner.pipeline.choose_split`: fewest bytes streamed in all, then the most
even split), and runs them as one executable (:class:`PipelineExecutable`). Per token only the residual stream
crosses between stages (``d_model`` float32 values); each stage's KV cache stays on its node.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uaii.ir import Graph
from uaii.runtime.errors import SessionError
from uaii.runtime.options import PIPELINE_OPTIONS, SessionOptions
from uaii.runtime.pipeline.executable import PipelineExecutable, PipelineState, StageInfo
from uaii.runtime.pipeline.plan import StagePlan, crossing_bytes, layer_kv_bytes, plan_stages, stage_starts
from uaii.runtime.pipeline.stage import StageRunner
from uaii.runtime.pipeline.transport import RAY_HINT, LocalStages, RayStages, StageFailure


def stage_options(given: Mapping[str, Any], context: int) -> dict[str, Any]:
    """The Session options a stage resolves on its node: the caller's own (its budget or preset among them), less
    the driver's, with the context the driver settled on (so that every stage's positions agree)."""
    kw = {k: v for k, v in given.items() if k not in PIPELINE_OPTIONS and k != "sequences"}
    kw["max_context"] = context
    return kw


def open_pipeline(path: str | Path, graph: Graph, options: SessionOptions, given: Mapping[str, Any],
                  context: int) -> PipelineExecutable:
    """The stages of ``graph`` (the model at ``path``, as the Session runs it) started, split and built."""
    k = options.pipeline
    if k < 2:
        raise SessionError(f"[runtime] a pipeline has at least 2 stages, found pipeline={k}")
    per_stage = [stage_options(given, context)] * k
    model = str(Path(path).resolve())
    stages: Any = (LocalStages(model, per_stage) if options.pipeline_transport == "local" else
                   RayStages(model, per_stage, address=options.ray_address, timeout_s=options.stage_timeout_s))
    try:
        described = stages.call("describe")
        starts = stage_starts(graph, options, [d["budget_bytes"] for d in described], context)
        infos = [StageInfo.of(s) for s in stages.call("build", [(starts, i) for i in range(k)])]
    except BaseException:
        stages.close()
        raise
    return PipelineExecutable(stages, infos)


__all__ = ["RAY_HINT", "LocalStages", "PipelineExecutable", "PipelineState", "RayStages", "StageFailure",
           "StageInfo", "StagePlan", "StageRunner", "crossing_bytes", "layer_kv_bytes", "open_pipeline", "plan_stages",
           "stage_options", "stage_starts"]
