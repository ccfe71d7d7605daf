"""The domain: entities and rules of the task orchestrator. Pure Python, no I/O."""
