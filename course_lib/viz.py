"""Pictures for the labs, one section per topic; every function returns a matplotlib Figure.

Figures are built through pyplot (so a notebook's inline backend renders them) and closed before they are
returned, so a cell that ends with the call shows the figure exactly once. Tests draw them with Agg.

Sections:
    Collectives (lab 01): :func:`collective_picture`, which rank holds what before and after a collective.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["collective_picture", "rank_colour"]

# Shared by every picture: rank r is drawn in the same colour everywhere in the course.
_RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
_COMPUTED_COLOUR = "#e6e6e6"


def rank_colour(rank: int) -> str:
    """The colour that stands for `rank` in every course figure."""
    return _RANK_COLOURS[rank % len(_RANK_COLOURS)]


# ------------------------------------------------------------------------------------------ collectives

# What one rank holds: a tensor, a list of tensors (drawn as separate chunks), or None (holds nothing).
RankHolding = Any

_BOX_W, _BOX_H, _CHUNK_GAP = 1.0, 0.8, 0.35


def collective_picture(
    name: str,
    before: Sequence[RankHolding],
    after: Sequence[RankHolding],
    *,
    reduced: bool | None = None,
    caption: bool = True,
) -> "Figure":
    """Draw which rank holds which values before and after a collective, side by side.

    `before[r]` and `after[r]` are what rank r holds: a tensor (any shape, drawn flattened), a list of
    tensors (each drawn as a separate chunk, e.g. the output list of ``all_gather``), or None (nothing,
    e.g. a non-root rank's output of ``gather``). Each value is a box with its number in it. A value
    before is coloured by the rank holding it; a value after is coloured by the rank it came from when
    exactly one rank held that value before, and grey when it was computed on the way (a sum, say).
    So give each rank distinct values (``torch.arange(4) + 10 * rank`` works well) to see them travel.

    `reduced` says the values after are computed (all grey); by default it is true when `name` contains
    "reduce" (all_reduce, reduce_scatter, reduce), since a sum may equal some rank's value by chance.
    """
    import matplotlib.pyplot as plt

    if len(before) != len(after):
        raise ValueError(f"before has {len(before)} ranks but after has {len(after)}: give one entry per rank")
    before_rows = [_chunks(held) for held in before]
    after_rows = [_chunks(held) for held in after]
    if reduced is None:
        reduced = "reduce" in name
    origin = {} if reduced else _origins(before_rows)
    widths = [max([_row_width(row) for row in rows] + [1.0]) for rows in (before_rows, after_rows)]
    world = len(before_rows)

    fig, axes = plt.subplots(
        1,
        2,
        figsize=(0.42 * sum(widths) + 2.2, 0.42 * world + (1.05 if caption else 0.75)),
        gridspec_kw={"width_ratios": [w + 1.3 for w in widths], "wspace": 0.08},
    )
    _draw_panel(axes[0], before_rows, "before", widths[0], lambda rank, value: rank_colour(rank))
    _draw_panel(
        axes[1],
        after_rows,
        f"after {name}",
        widths[1],
        lambda rank, value: rank_colour(origin[value]) if value in origin else _COMPUTED_COLOUR,
    )
    if caption:
        fig.text(
            0.5,
            0.02,
            "colour: the rank a value came from; grey: computed on the way",
            ha="center",
            va="bottom",
            fontsize=7,
            color="#555555",
            gid="caption",
        )
    plt.close(fig)
    return fig


def _chunks(held: RankHolding) -> list[list[float | int]]:
    """What one rank holds, as a list of chunks of plain numbers."""
    if held is None:
        return []
    if isinstance(held, (list, tuple)) and all(hasattr(t, "tolist") for t in held):
        return [_flat(t) for t in held]
    return [_flat(held)]


def _flat(tensor: Any) -> list[float | int]:
    return tensor.reshape(-1).tolist() if hasattr(tensor, "reshape") else list(tensor)


def _row_width(chunks: list[list[float | int]]) -> float:
    return sum(len(c) for c in chunks) * _BOX_W + max(len(chunks) - 1, 0) * _CHUNK_GAP


def _origins(rows: list[list[list[float | int]]]) -> dict[float | int, int]:
    """Value -> the one rank that held it before (values held by several ranks are left out)."""
    holders: dict[float | int, set[int]] = {}
    for rank, chunks in enumerate(rows):
        for chunk in chunks:
            for value in chunk:
                holders.setdefault(value, set()).add(rank)
    return {value: ranks.pop() for value, ranks in holders.items() if len(ranks) == 1}


def _label(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _draw_panel(ax: Any, rows: list, title: str, width: float, colour_of: Any) -> None:
    from matplotlib.patches import Rectangle

    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlim(-1.3, width + 0.05)
    ax.set_ylim(len(rows) - 0.5 + 0.05, -0.55)
    ax.set_axis_off()
    for rank, chunks in enumerate(rows):
        ax.text(-0.15, rank, f"rank {rank}", ha="right", va="center", fontsize=8, gid="rank-label")
        if not chunks:
            ax.text(0.0, rank, "(nothing)", ha="left", va="center", fontsize=7, color="#888888", gid="nothing")
        x = 0.0
        for chunk in chunks:
            for value in chunk:
                fill = colour_of(rank, value)
                ax.add_patch(
                    Rectangle(
                        (x + 0.04, rank - _BOX_H / 2),
                        _BOX_W - 0.08,
                        _BOX_H,
                        facecolor=fill,
                        alpha=0.85,
                        edgecolor="white",
                        gid="box",
                    )
                )
                ax.text(
                    x + _BOX_W / 2,
                    rank,
                    _label(value),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if fill == _COMPUTED_COLOUR else "white",
                    gid="value",
                )
                x += _BOX_W
            x += _CHUNK_GAP
