"""File formats, torch-free: the trace document and saved journeys (written and read back)."""
