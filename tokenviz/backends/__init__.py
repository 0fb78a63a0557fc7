"""The backends that run a model for the journey: each implements the capabilities of contract.engine it
can (the transformers one, in its own process, every one; a model server's, what the server exposes)."""
