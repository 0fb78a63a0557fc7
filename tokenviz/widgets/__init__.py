"""The panes. Each renders plain data from a Snapshot; none touches torch."""

from tokenviz.widgets.attention import AttentionPane
from tokenviz.widgets.next_token import NextTokenPane
from tokenviz.widgets.sampling_pane import SamplingPane
from tokenviz.widgets.status import StatusLine
from tokenviz.widgets.tokens import TokensPane

__all__ = ["AttentionPane", "NextTokenPane", "SamplingPane", "StatusLine", "TokensPane"]
