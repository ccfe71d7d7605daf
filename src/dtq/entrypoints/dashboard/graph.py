"""The job page's DAG drawing (issue 16 item 3): layers and SVG coordinates, computed on the
server from a :class:`~dtq.application.queries.JobGraph`.

A task's layer is the length of the longest dependency path leading to it (roots are layer
0), so every edge points to a later layer. Layers are columns, tasks keep their submission
order inside a column. Pure functions: no I/O, O(V + E).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from dtq.domain.entities import Task

#: Node box size and the gaps between columns and rows, in SVG user units.
NODE_W, NODE_H = 150, 30
COL_GAP, ROW_GAP = 60, 14
MARGIN = 10
#: Characters of a task name shown inside its box (the full name is in the tooltip).
LABEL_CHARS = 18


@dataclass(frozen=True, slots=True)
class Node:
    """A task's box: top-left corner ``(x, y)``, its label and status."""

    task: Task
    x: int
    y: int
    label: str


@dataclass(frozen=True, slots=True)
class Edge:
    """A line from the right side of a dependency's box to the left side of its dependent's."""

    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True, slots=True)
class Drawing:
    """What the SVG template draws: its size, the boxes and the lines."""

    width: int
    height: int
    nodes: list[Node]
    edges: list[Edge]
    layers: int


def layers(tasks: Sequence[Task], edges: Sequence[tuple[UUID, UUID]]) -> dict[UUID, int]:
    """Each task's layer: 0 for a task without dependencies, else one more than the deepest
    of its dependencies (Kahn's order; edges naming a task outside ``tasks`` are ignored).

    A cycle cannot be stored (submit refuses it); tasks on one would keep layer 0.
    """
    ids = {t.id for t in tasks}
    children: dict[UUID, list[UUID]] = {t.id: [] for t in tasks}
    indegree = dict.fromkeys(ids, 0)
    for parent, child in edges:
        if parent in ids and child in ids:
            children[parent].append(child)
            indegree[child] += 1
    layer = dict.fromkeys(ids, 0)
    ready = [t.id for t in tasks if indegree[t.id] == 0]
    while ready:
        current = ready.pop()
        for child in children[current]:
            layer[child] = max(layer[child], layer[current] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return layer


def _label(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def draw(tasks: Sequence[Task], edges: Sequence[tuple[UUID, UUID]]) -> Drawing:
    """Lay ``tasks`` out in columns by :func:`layers` and route ``edges`` between them."""
    layer_of = layers(tasks, edges)
    rows: dict[int, int] = {}
    nodes: dict[UUID, Node] = {}
    for task in sorted(tasks, key=lambda t: (layer_of[t.id], t.position)):
        col = layer_of[task.id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        x = MARGIN + col * (NODE_W + COL_GAP)
        y = MARGIN + row * (NODE_H + ROW_GAP)
        nodes[task.id] = Node(task, x, y, _label(task.name))
    lines = [
        Edge(
            nodes[p].x + NODE_W,
            nodes[p].y + NODE_H // 2,
            nodes[c].x,
            nodes[c].y + NODE_H // 2,
        )
        for p, c in edges
        if p in nodes and c in nodes
    ]
    columns = max(rows, default=-1) + 1
    tallest = max(rows.values(), default=0)
    return Drawing(
        width=2 * MARGIN + max(columns, 1) * (NODE_W + COL_GAP) - COL_GAP,
        height=2 * MARGIN + max(tallest, 1) * (NODE_H + ROW_GAP) - ROW_GAP,
        nodes=list(nodes.values()),
        edges=lines,
        layers=columns,
    )
