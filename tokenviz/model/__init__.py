"""The model: loading and resolution, the KV-cached runner, the logit lens and the host transfer.
No sampling policy and no textual here."""
