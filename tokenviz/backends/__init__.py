"""The backends that run a model for the journey: each implements the tiers of contract.engine it can
(the transformers one, in its own process, every tier)."""
