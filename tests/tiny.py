"""Tiny causal LMs built from configs with random weights, and a tokenizer trained in memory.

Unit tests run on these, so they need no download and take milliseconds per step.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tokenviz.backends.transformers.attention import capturing, use_fast_attention
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.model_description import model_info

CORPUS = [
    "The Eiffel Tower is located in Paris, the capital of France.",
    "A token travels through embeddings, attention and the unembedding to become logits.",
    "Hello world! Sampling picks the next token from the distribution, one step at a time.\n",
    "The cat sat on the mat. The dog sat on the log. 0123456789 ?!",
]
EOS = "<|end|>"


@lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def tiny_model(
    kind: str = "llama", context: int = 128, seed: int = 0, device: str = "cpu", layers: int = 3
) -> LoadedModel:
    """kind: 'llama' (RoPE, grouped-query attention; `layers` of them) or 'gpt2' (learned absolute
    positions); made on the CPU (the same weights for a seed on any device), then moved to `device`."""
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    vocab = len(tokenizer)
    eos = tokenizer.eos_token_id
    if kind == "llama":
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=context,
            eos_token_id=eos,
            bos_token_id=eos,
            pad_token_id=eos,
            tie_word_embeddings=True,
        )
        config._attn_implementation = "eager"
        model = LlamaForCausalLM(config)
    elif kind == "gpt2":
        config = GPT2Config(
            vocab_size=vocab,
            n_positions=context,
            n_embd=32,
            n_layer=2,
            n_head=4,
            eos_token_id=eos,
            bos_token_id=eos,
            pad_token_id=eos,
        )
        config._attn_implementation = "eager"
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(kind)
    # Random weights give a flat distribution; sharpen it so sampling stages have work to do.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.pad_token_id = eos
    model.generation_config.eos_token_id = eos
    model.eval().to(device)
    use_fast_attention(model)  # as load_model does
    return LoadedModel(
        model=model, tokenizer=tokenizer, info=model_info(model, f"tiny-{kind}", torch.device(device), torch.float32)
    )


def save_tiny(directory, kind: str = "llama", context: int = 128) -> str:
    loaded = tiny_model(kind, context)
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    return str(directory)


def eager_forward(model, ids: list[int]):
    """A full forward pass without the cache in the model's eager attention, weights returned, through
    this model object (its hooks included: a test's own reference ablation, a padded vocabulary's
    preference). Where the model is plain, tests/stock.py's transformers-alone reference is the one."""
    with torch.inference_mode(), capturing(eager=True):
        return model(torch.tensor([ids], device=model.device), use_cache=False, output_attentions=True)


CHAT_TEMPLATE = (
    "{% for m in messages %}" + EOS + "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}" + EOS + "assistant: {% endif %}"
)


def tiny_chat_model(kind: str = "llama") -> LoadedModel:
    """The tiny model with a chat template on (a copy of) its tokenizer."""
    import copy

    loaded = tiny_model(kind)
    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    return LoadedModel(model=loaded.model, tokenizer=tokenizer, info=loaded.info)
