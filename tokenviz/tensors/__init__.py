"""Torch helpers shared by the backends and the decoding code: moving tensors to and from a device
in one transfer, and timing work on it."""
