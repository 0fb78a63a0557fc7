"""Model loading and the KV-cached forward pass. No textual, no sampling policy."""

from tokenviz.engine.loading import LoadedModel, load_model
from tokenviz.engine.runner import Forward, ModelRunner

__all__ = ["Forward", "LoadedModel", "ModelRunner", "load_model"]
