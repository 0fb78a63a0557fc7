"""A model a server runs, reached through an OpenAI-compatible endpoint (vLLM's): the endpoint, its
token, and a journey stepped a request per token. Torch-free: a served trace imports no model code."""
