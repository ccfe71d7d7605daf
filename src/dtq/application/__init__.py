"""Application layer: use-case services and the ports they depend on."""
