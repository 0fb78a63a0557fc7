"""The worker: one engine thread that owns the model; commands in, Snapshots out."""
