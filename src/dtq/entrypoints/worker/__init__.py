"""The worker wing: the runtime process that pops, claims, runs and reports tasks (spec §5, §6).

``runtime`` (registration, the one way to run), ``config`` (``WorkerConfig``), ``session`` (one
run: lifecycle of each claim, shutdown), ``fetch`` (slots, the transaction turn, pop and claim),
``runner`` (one handler call), ``completions`` (the success batcher, the retrying report helper),
``leases`` (the lease renewal loop). Handler authors import :mod:`dtq.worker` instead.
"""
