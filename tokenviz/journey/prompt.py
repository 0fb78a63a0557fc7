"""A prompt made into token ids: plain text, ids as they are, or a user's message through the model's
chat template; an empty, too long or untokenizable prompt refused in one line."""

from __future__ import annotations

from tokenviz.contract.engine import Engine
from tokenviz.contract.errors import PromptError


def encode_prompt(engine: Engine, prompt: str | list[int]) -> tuple[str, list[int]]:
    """(text, token ids) of a prompt given as text or as ids; refuses an empty or too long one."""
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise PromptError("the prompt is not valid UTF-8 text") from None
        ids = engine.encode(prompt)
        vocab = engine.info.vocab
        beyond = next((t for t in ids if not 0 <= t < vocab), None)
        if beyond is not None:  # a token the tokenizer added past the model's embeddings
            raise PromptError(
                f"the prompt holds the token {engine.piece(beyond)!r} (id {beyond}), past the model's "
                f"vocabulary of {vocab:,}: its tokenizer has tokens its embeddings lack"
            )
    else:
        ids = [int(t) for t in prompt]
        if any(not 0 <= t < engine.info.vocab for t in ids):
            raise PromptError(f"prompt token ids must be in 0-{engine.info.vocab - 1}")
        prompt = engine.decode(ids)
    context = engine.info.context
    if not ids:
        raise PromptError("the prompt is empty: type some text to start from")
    if len(ids) >= context:
        raise PromptError(f"the prompt has {len(ids)} tokens but this model reads at most {context}; shorten it")
    return prompt, ids


Tokenized = tuple[str, list[int], list[bool]]  # text, token ids, which ids the chat template added


def tokenize(engine: Engine, prompt: str | list[int], chat: bool = False, system: str | None = None) -> Tokenized:
    """(text, token ids, which ids the chat template added) of a prompt: plain text or ids, or
    with `chat` a user message put through the model's chat template."""
    if not chat:
        return (*encode_prompt(engine, prompt), [])
    if not isinstance(prompt, str):
        raise PromptError("a chat prompt is text: the user's message")
    encode_prompt(engine, prompt)  # the same checks as plain text
    encoded = engine.chat_ids(prompt, system)
    encode_prompt(engine, encoded.ids)  # and the template's length against the context
    return prompt, encoded.ids, encoded.template
