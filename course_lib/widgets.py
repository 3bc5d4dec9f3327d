"""Interactive pieces for JupyterLab: the plan explorer.

    from course_lib.widgets import PlanExplorer
    PlanExplorer(tables)            # pick world size, ranks per node, memory per rank, a constraint per table;
                                    # "Plan" re-runs TorchRec's planner here, in the kernel, on meta tables

The logic is one plain function, :func:`plan_layout` (request in, table + figure or a plain-words error out),
tested without a browser; :class:`PlanExplorer` is a thin ipywidgets view over it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure
    from torchrec import EmbeddingBagConfig

ANY = "any"
SHARDING_CHOICES = {
    "cuda": (ANY, "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", "data_parallel"),
    "cpu": (ANY, "table_wise", "column_wise", "table_column_wise", "data_parallel"),
}


@dataclass(frozen=True)
class PlanRequest:
    """What the learner asks the planner for."""

    world_size: int = 8
    ranks_per_node: int = 4
    memory_gib: float = 16.0  # per rank: HBM on "cuda", DRAM on "cpu"
    compute_device: str = "cuda"
    constraints: Mapping[str, str] = field(default_factory=dict)  # table name -> sharding type or "any"


@dataclass
class PlanOutcome:
    """The planner's answer: a plan with its table and per-rank memory figure, or an error in plain words."""

    request: PlanRequest
    plan: Any = None
    table: "pandas.DataFrame | None" = None
    figure: "Figure | None" = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def explain_planner_error(error: Exception, request: PlanRequest) -> str:
    """The planner's own error, in a few plain words (its numbers, not a traceback).

    torchrec writes its storage figures with "GB", but they are GiB: ``bytes_to_gb`` in
    ``torchrec/distributed/planner/utils.py`` divides by 1024**3. The summary says GiB.
    """
    text = str(error)
    need = re.search(r"Global storage requirement for model parallel: Storage\(hbm = ([\d.]+) GB, ddr = ([\d.]+) GB", text)
    have = re.search(r"Global storage available for model parallel: Storage\(hbm = ([\d.]+) GB, ddr = ([\d.]+) GB", text)
    memory = "HBM" if request.compute_device == "cuda" else "DRAM"
    if "insufficient storage" in text and need and have:
        need_gb = max(float(need.group(1)), float(need.group(2)))
        return (
            f"The planner cannot fit these tables: they need {need_gb:g} GiB, and {request.world_size} ranks with "
            f"{request.memory_gib:g} GiB of {memory} each leave {float(have.group(1)):g} GiB of {memory} "
            f"(+ {float(have.group(2)):g} GiB host memory) for them. Add ranks, give each rank more memory, "
            "or relax the constraints."
        )
    if "strict constraints" in text:
        return (
            f"The planner cannot satisfy these constraints with {request.memory_gib:g} GiB of {memory} on each of "
            f"{request.world_size} ranks: set some tables back to '{ANY}', or give each rank more memory."
        )
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"The planner refused: {first}"


def plan_layout(tables: Sequence["EmbeddingBagConfig"], request: PlanRequest) -> PlanOutcome:
    """Plan `tables` for the cluster described by `request` with TorchRec's planner (no process group needed)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.types import PlannerError

    from course_lib import planning

    outcome = PlanOutcome(request)
    if request.world_size < 1 or request.ranks_per_node < 1 or request.world_size % request.ranks_per_node:
        outcome.error = (
            f"{request.world_size} ranks cannot be split into nodes of {request.ranks_per_node}: "
            "the world size must be a multiple of the ranks per node."
        )
        return outcome
    allowed = SHARDING_CHOICES.get(request.compute_device)
    if allowed is None:
        outcome.error = f"compute_device must be 'cuda' or 'cpu', not {request.compute_device!r}."
        return outcome
    names = {t.name for t in tables}
    constraints = {}
    for name, sharding in request.constraints.items():
        if name not in names:
            outcome.error = f"there is no table {name!r}; the tables are {sorted(names)}."
            return outcome
        if sharding not in allowed:
            outcome.error = f"{sharding!r} is not a sharding type the planner offers on {request.compute_device}: {allowed[1:]}."
            return outcome
        if sharding != ANY:
            constraints[name] = ParameterConstraints(sharding_types=[sharding])
    cap = int(request.memory_gib * 2**30)
    caps = {"hbm_cap_bytes": cap} if request.compute_device == "cuda" else {"ddr_cap_bytes": cap}
    topology = planning.topology(
        request.world_size, compute_device=request.compute_device, local_world_size=request.ranks_per_node, **caps
    )
    try:
        outcome.plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).plan(
            planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()]
        )
    except PlannerError as error:
        outcome.error = explain_planner_error(error, request)
        return outcome
    outcome.table = planning.plan_table(outcome.plan, tables)
    outcome.figure = planning.plot_memory({"planner": outcome.plan}, tables, request.world_size)
    return outcome


class PlanExplorer:
    """An ipywidgets panel over :func:`plan_layout`: controls on the left, plan table and memory plot on the right."""

    def __init__(self, tables: Sequence["EmbeddingBagConfig"], request: PlanRequest | None = None) -> None:
        import ipywidgets as w

        self.tables = list(tables)
        request = request or PlanRequest()
        self.world_size = w.BoundedIntText(value=request.world_size, min=1, max=4096, description="ranks")
        self.ranks_per_node = w.BoundedIntText(value=request.ranks_per_node, min=1, max=64, description="per node")
        self.memory = w.BoundedFloatText(value=request.memory_gib, min=0.001, max=4096, description="GiB/rank")
        self.device = w.Dropdown(options=["cuda", "cpu"], value=request.compute_device, description="device")
        self.constraints = {
            t.name: w.Dropdown(
                options=SHARDING_CHOICES[request.compute_device],
                value=request.constraints.get(t.name, ANY),
                description=t.name,
            )
            for t in self.tables
        }
        self.device.observe(self._device_changed, names="value")
        self.button = w.Button(description="Plan", button_style="primary", icon="play")
        self.button.on_click(lambda _: self.replan())
        self.status = w.HTML()
        self.table_out = w.Output()
        self.figure_out = w.Output()
        controls = w.VBox(
            [self.world_size, self.ranks_per_node, self.memory, self.device, w.HTML("<b>constraints</b>"),
             *self.constraints.values(), self.button, self.status],
            layout=w.Layout(width="330px"),
        )
        self.widget = w.HBox([controls, w.VBox([self.table_out, self.figure_out])])
        self.widget.add_class("course-plan-explorer")
        self.outcome: PlanOutcome | None = None
        self.replan()

    def _device_changed(self, change: Mapping[str, Any]) -> None:
        for dropdown in self.constraints.values():
            options = SHARDING_CHOICES[change["new"]]
            value = dropdown.value if dropdown.value in options else ANY
            dropdown.options = options
            dropdown.value = value

    def request(self) -> PlanRequest:
        return PlanRequest(
            world_size=int(self.world_size.value),
            ranks_per_node=int(self.ranks_per_node.value),
            memory_gib=float(self.memory.value),
            compute_device=str(self.device.value),
            constraints={name: d.value for name, d in self.constraints.items()},
        )

    def replan(self) -> PlanOutcome:
        from IPython.display import HTML, display

        self.status.value = "<i>planning…</i>"
        outcome = plan_layout(self.tables, self.request())
        self.outcome = outcome
        self.table_out.clear_output(wait=True)
        self.figure_out.clear_output(wait=True)
        if outcome.ok:
            with self.table_out:
                display(HTML(outcome.table.to_html(classes="course-plan-table")))
            with self.figure_out:
                display(outcome.figure)
            self.status.value = f"<span class='course-plan-ok'>planned {len(self.tables)} tables on {outcome.request.world_size} ranks</span>"
        else:
            self.status.value = ""
            with self.table_out:
                display(HTML(f"<div class='course-plan-error' style='color:#b00020'>{outcome.error}</div>"))
        return outcome

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
