"""dtq benchmarks: throughput, latency and scale on real PostgreSQL + Redis, next to its peers.

Run ``python -m benchmarks.run`` (see ``benchmarks/README.md``). Nothing here is imported by
``dtq`` or by the test suite.
"""
