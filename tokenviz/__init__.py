"""tokenviz: watch a language model think, one token at a time."""

import logging

__version__ = "0.1.0"

# transformers imports torchao whenever it is installed, and at import torchao warns that its GPU
# kernels do not load on this machine, and torch that torchao registers enums the old way: news for
# their developers, printed on the user's terminal (over the app, or before a trace's table).
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
