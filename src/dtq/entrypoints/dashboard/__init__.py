"""The dashboard: room reserved beside :mod:`dtq.entrypoints.api`, empty until its issue.

What goes here: the read-only web pages over jobs, tasks, runs and workers (and, once the
events outbox exists, their live updates), mounted on the orchestrator's Litestar app by
:func:`dtq.entrypoints.api.create_app` or served on its own route prefix. It takes the API's
bundle (:class:`dtq.entrypoints.bundles.ApiServices`: queries, health) from the composition root
like every other process part, reads through the same services (keyset-paginated lists, never
a count of a whole table) and names no adapter.
"""
