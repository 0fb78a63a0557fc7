"""A model of a real model's shape with random weights, made straight on the device: Llama 3 8B's
16 GB of bfloat16 weights cost no download and no disk, and a second copy with transformers' own
sdpa attention (the bare baseline) shares the same tensors."""

from __future__ import annotations

import copy

import torch

from tokenviz.backends.transformers.attention import use_fast_attention
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.model_description import model_info

LLAMA_3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
# The bundled model's shape (SmolLM2 135M): its figures on a GPU without carrying its 98 MB file there.
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
SHAPES = {"8B": LLAMA_3_8B, "135M": SMOLLM2_135M}


def word_tokenizer(vocab: int):
    """A tokenizer of `vocab` words w0, w1, … (one per id), so every id the model draws has a piece."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def shaped_model(device: torch.device, dtype: torch.dtype = torch.bfloat16, shape: dict | None = None):
    """(the model as tokenviz loads it, the same weights with sdpa attention and nothing else), of
    `shape` (Llama 3 8B's by default)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **(shape or LLAMA_3_8B))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: run every step asked for
    model.generation_config.pad_token_id = config.vocab_size - 1  # (not 0: the prompt's unknown words are 0)
    use_fast_attention(model)  # as load_model does
    with torch.device("meta"):  # (a config of its own: from_config sets the attention on the config)
        bare = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype, attn_implementation="sdpa")
    bare.eval()
    bare.load_state_dict(model.state_dict(), assign=True)
    own = dict(model.named_buffers())
    for name, buffer in list(bare.named_buffers()):  # (the rotary frequencies are not in the state dict)
        if buffer.is_meta:
            module, _, leaf = name.rpartition(".")
            setattr(bare.get_submodule(module), leaf, own[name])
    bare.generation_config = model.generation_config
    named = {id(v): k for k, v in SHAPES.items()}.get(id(shape or LLAMA_3_8B))
    name = (
        f"{named}-shaped llama (random {str(dtype).removeprefix('torch.')} weights)"
        if named
        else "shaped model (random weights)"
    )
    loaded = LoadedModel(
        model=model, tokenizer=word_tokenizer(config.vocab_size), info=model_info(model, name, device, dtype)
    )
    return loaded, bare


def weights_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def measured_models(device: str, dtype: str, shape: str | None):
    """(the model the bench measures, as tokenviz loads it; the same weights bare, with sdpa): a shape's
    random weights made on the device, or the bundled model and its bare copy loaded from its directory.
    Each is made in a thread of its own (see timing.in_thread)."""
    from bench.anchors import bare_model
    from bench.timing import in_thread
    from tokenviz.backends.transformers.gguf_cache import gguf_cache_dir
    from tokenviz.backends.transformers.loading import load_model, resolve_device
    from tokenviz.system.paths import bundled_gguf

    if shape:
        return in_thread(lambda: shaped_model(resolve_device(device), shape=SHAPES[shape]))
    loaded = in_thread(lambda: load_model(None, device=device, dtype=dtype))
    source = str(gguf_cache_dir(bundled_gguf()))
    return loaded, in_thread(lambda: bare_model(loaded, source, next(loaded.model.parameters()).device))
