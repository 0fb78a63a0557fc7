"""What tokenviz asks of the operating system: reading a file the user names, where its own files
live, interrupting a thread part way, a thread with a deep stack. Below every layer but the contract,
which holds data and protocols only."""
