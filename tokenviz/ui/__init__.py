"""The Textual app: panes, screens and keys. It reads Snapshots and submits commands; it never
imports torch."""
