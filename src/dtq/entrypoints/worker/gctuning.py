"""Cyclic garbage collector settings of a worker process (issue 17: worker CPU per task).

CPython's collector runs a young-generation pass every ``threshold0`` (700) net allocations of
container objects; the drain allocates a few dozen per task (entities, rows, futures), so it
ran every few tasks, promoted the objects of the claims in flight to the older generations, and
every few hundred tasks walked the whole heap (the imported modules included). That is CPU the
worker spends on nothing it needs: its objects are freed by reference counting, not by the
collector. :func:`tune` freezes what exists at start (``gc.freeze``: modules, pools, config,
never collected again) and raises ``threshold0``, so the collector still runs (cyclic garbage
stays bounded, by ``threshold0`` container objects) but rarely. Figures: ``benchmarks/PROFILE.md``
("Fifth pass").
"""

from __future__ import annotations

import gc

#: Young-generation threshold while a worker runs (CPython's default is 700).
WORKER_GC_THRESHOLD0 = 10_000


class _Process:
    """Whether :func:`tune` ran in this process."""

    tuned = False


def tune() -> bool:
    """Freeze the objects alive now and raise the young-generation threshold to
    :data:`WORKER_GC_THRESHOLD0` (never lowering one set higher). Once per process: later calls
    change nothing.

    Returns:
        True if this call tuned the collector, False if an earlier call did.
    """
    if _Process.tuned:
        return False
    _Process.tuned = True
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    threshold0, threshold1, threshold2 = gc.get_threshold()
    gc.set_threshold(max(threshold0, WORKER_GC_THRESHOLD0), threshold1, threshold2)
    return True
