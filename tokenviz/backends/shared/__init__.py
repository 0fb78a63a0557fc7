"""What every backend that runs or reads a Hugging Face model shares: a model directory's config, tokenizer
and checkpoint headers, where a model keeps its parts, its own output (final norm, head, logit
transforms) and the logit lens read through it, and each token's text. No backend's own code: each
backend imports from here, none from another (an import-linter contract)."""
