"""The journey: the session (tokens, step records, rewind), its branches, stop rules, on-demand
inspection and verification, and re-running a saved journey."""
