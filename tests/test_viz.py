"""course_lib.viz draws without a display, and its pictures reflect the data they are given."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from course_lib import viz


def _texts(ax, gid):
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def _boxes(ax):
    return [p for p in ax.patches if p.get_gid() == "box"]


def _before_after(world=2, n=4):
    return [torch.arange(float(n)) + 10 * rank for rank in range(world)]


# ------------------------------------------------------------------------------------- collectives


def test_collective_picture_has_a_box_and_a_label_per_value():
    before = _before_after()
    after = [sum(before)] * 2
    fig = viz.collective_picture("all_reduce", before, after)
    left, right = fig.axes
    assert len(fig.axes) == 2
    assert _texts(left, "value") == ["0", "1", "2", "3", "10", "11", "12", "13"]
    assert _texts(right, "value") == ["10", "12", "14", "16"] * 2
    assert len(_boxes(left)) == 8 and len(_boxes(right)) == 8
    assert _texts(left, "rank-label") == _texts(right, "rank-label") == ["rank 0", "rank 1"]
    assert right.get_title(loc="left") == "after all_reduce"
    fig.canvas.draw()  # renders with Agg without error


def test_values_are_coloured_by_the_rank_they_came_from():
    before = _before_after()
    after = [torch.tensor([0.0, 1.0, 10.0, 11.0]), torch.tensor([2.0, 3.0, 12.0, 13.0])]  # all_to_all
    fig = viz.collective_picture("all_to_all_single", before, after)
    right = fig.axes[1]
    faces = [matplotlib.colors.to_hex(b.get_facecolor()[:3]) for b in _boxes(right)]
    r0, r1 = viz.rank_colour(0), viz.rank_colour(1)
    assert faces == [r0, r0, r1, r1, r0, r0, r1, r1]


def test_reduced_values_are_grey_even_when_they_equal_some_rank_s_value():
    before = _before_after()
    fig = viz.collective_picture("all_reduce", before, [sum(before)] * 2)  # 10 and 12 also sit on rank 1
    faces = {matplotlib.colors.to_hex(b.get_facecolor()[:3]) for b in _boxes(fig.axes[1])}
    assert faces == {viz._COMPUTED_COLOUR}


def test_lists_are_drawn_as_chunks_and_none_as_nothing():
    before = _before_after(world=3, n=2)
    fig = viz.collective_picture("gather", before, [before, None, None])
    right = fig.axes[1]
    assert len(_boxes(right)) == 6
    assert _texts(right, "nothing") == ["(nothing)", "(nothing)"]
    xs = [b.get_x() for b in _boxes(right)]
    steps = [round(b - a, 2) for a, b in zip(xs, xs[1:])]
    assert steps == [1.0, 1.35, 1.0, 1.35, 1.0]  # a gap between the three gathered tensors


def test_figure_widens_with_the_data_and_labels_integers_and_floats():
    small = viz.collective_picture("x", [torch.zeros(2)], [torch.zeros(2)])
    wide = viz.collective_picture("x", [torch.zeros(2)], [torch.tensor([0.5, 1.0, 2.0, 1.25, 3.0, 4.0])])
    assert wide.get_figwidth() > small.get_figwidth()
    assert _texts(wide.axes[1], "value") == ["0.5", "1", "2", "1.25", "3", "4"]
    ints = viz.collective_picture("x", [torch.tensor([7, 8])], [torch.tensor([7])], caption=False)
    assert _texts(ints.axes[0], "value") == ["7", "8"]
    assert not [t for t in ints.texts if t.get_gid() == "caption"]


def test_mismatched_rank_counts_are_refused():
    with pytest.raises(ValueError, match="one entry per rank"):
        viz.collective_picture("x", _before_after(world=2), _before_after(world=3))


def test_rank_colours_are_stable_and_distinct():
    colours = [viz.rank_colour(r) for r in range(8)]
    assert len(set(colours)) == 8
    assert viz.rank_colour(8) == viz.rank_colour(0)
