"""The backend of a model a server runs (vLLM's OpenAI-compatible server): the engine (engine.py), and
with the vllm-lens plugin on the server its internals: the model's own output head read here (head.py)
and what the plugin's activations become (internals.py)."""
