"""Chat prompts: a user message (after an optional system message) put through the model's own
chat template, with the generation prompt, and which tokens the template added."""

from __future__ import annotations

from typing import Any

from tokenviz.backends.shared.chat_template import bounded, render_chat_template
from tokenviz.contract.engine import ChatIds
from tokenviz.contract.errors import PromptError


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, user: str, system: str | None = None) -> ChatIds:
    """The token ids `generate()` would be given for this conversation: exactly
    apply_chat_template(messages, add_generation_prompt=True)."""
    if not has_chat_template(tokenizer):
        raise PromptError("this model's tokenizer has no chat template: drop --chat to give it plain text")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    # (the template is the model's code: rendered within bounds first, where a failure is one line; then
    # by transformers itself, under the same deadline, for the ids generate() would be given)
    render_chat_template(tokenizer.chat_template, messages, **tokenizer.special_tokens_map)
    with bounded():
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    return ChatIds(ids, _template_mask(tokenizer, text, ids, [user, system or ""]))


def _template_mask(tokenizer: Any, text: str, ids: list[int], contents: list[str]) -> list[bool]:
    """Which tokens lie outside the messages' own words. Found from the rendered text's offsets; if
    they do not line up with the template's ids, only the special tokens count as the template's."""
    spans = [(start, start + len(c)) for c in contents if c and (start := text.rfind(c)) >= 0]
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"] if list(encoded["input_ids"]) == ids else None
    except (NotImplementedError, ValueError, TypeError):  # a slow tokenizer has no offsets
        offsets = None
    if offsets is None:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        return [t in special for t in ids]
    return [not any(a <= start and end <= b for a, b in spans) for start, end in offsets]
