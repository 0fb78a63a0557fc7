"""The panes: each draws plain data from a Selection of the current Snapshot."""
