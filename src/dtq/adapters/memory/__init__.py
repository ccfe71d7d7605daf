"""In-memory adapters: fakes of every port with the real adapters' semantics."""
