"""The transformers backend: a model loaded here (GGUF cache, device maps, quantization, the compiled
step), its KV-cached runner (every capability of contract.engine), and what reads its layers: the logit lens,
attribution, the logit split, interventions as hooks, routing, beam search and speculation."""
