"""Cyclic garbage collector settings of a long-running dtq process (issue 17: CPU per task and
per request).

CPython's collector runs a young-generation pass every ``threshold0`` (700) net allocations of
container objects, and every tenth such pass a middle one, every tenth of those a full pass
over the whole heap (every imported module, the web framework's routes, the pools). A worker
allocates a few dozen container objects per task (entities, rows, futures) and the orchestrator
as many per request (the ASGI scope, headers, the submission), so the collector ran every few
tasks or requests and found nothing to free: their objects are freed by reference counting.
:func:`tune` freezes what exists at start (``gc.freeze``: modules, pools, configuration, never
collected again) and raises ``threshold0`` to :data:`GC_THRESHOLD0`, so the collector still
runs (cyclic garbage stays bounded, by ``threshold0`` container objects) but rarely. Called by
the first ``Runtime.run`` of a worker process and by the orchestrator once its app is built.
Figures: ``benchmarks/PROFILE.md`` ("Fifth pass" for the worker, "Seventeenth pass" for the
orchestrator).
"""

from __future__ import annotations

import gc

#: Young-generation threshold while a dtq process runs (CPython's default is 700).
GC_THRESHOLD0 = 10_000


class _Process:
    """Whether :func:`tune` ran in this process."""

    tuned = False


def tune() -> bool:
    """Collect once, freeze the objects alive then and raise the young-generation threshold to
    :data:`GC_THRESHOLD0` (never lowering one set higher). Once per process: later calls change
    nothing.

    Returns:
        True if this call tuned the collector, False if an earlier call did.
    """
    if _Process.tuned:
        return False
    _Process.tuned = True
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    threshold0, threshold1, threshold2 = gc.get_threshold()
    gc.set_threshold(max(threshold0, GC_THRESHOLD0), threshold1, threshold2)
    return True
