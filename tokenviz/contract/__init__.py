"""The contract between the engine and everything that shows it: plain, frozen, fully typed data.

Nothing here imports torch or textual, so the UI, the renderers and the file formats can use it
before (or without) a model.
"""
