"""Chat prompts: exactly the ids of the model's own chat template, with the template's tokens told
apart from the messages' words, and a clear refusal where there is no template."""

import pytest
from tiny import tiny_chat_model, tiny_model

from tokenviz.backends.transformers.chat import chat_ids
from tokenviz.contract.errors import PromptError

QUESTION = "What is the capital of France?"


def words(tokenizer, encoded) -> str:
    return tokenizer.decode([t for t, template in zip(encoded.ids, encoded.template) if not template])


@pytest.mark.parametrize("system", [None, "Answer in one word."])
def test_chat_ids_are_the_templates_and_the_messages_words_are_not_the_templates(system):
    tokenizer = tiny_chat_model().tokenizer
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": QUESTION}]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    encoded = chat_ids(tokenizer, QUESTION, system)
    assert encoded.ids == list(expected) and len(encoded.template) == len(encoded.ids)
    assert words(tokenizer, encoded) == (system or "") + QUESTION
    assert encoded.template[0] and encoded.template[-1]  # the turn markers are the template's


def test_the_bundled_models_template_and_its_own_system_message(bundled):
    tokenizer = bundled.tokenizer
    encoded = chat_ids(tokenizer, QUESTION)
    expected = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    assert encoded.ids == list(expected["input_ids"])
    assert words(tokenizer, encoded) == QUESTION  # the template's default system message is dimmed too


def test_a_model_without_a_chat_template_is_refused_in_one_line():
    with pytest.raises(PromptError, match="no chat template"):
        chat_ids(tiny_model().tokenizer, QUESTION)
