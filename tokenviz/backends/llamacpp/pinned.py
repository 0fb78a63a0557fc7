"""What tokenviz reaches of llama-cpp-python beyond its `Llama` class, from here alone: its bindings of
llama.cpp's C API, ggml's library, and the names llama.cpp gives the tensors of its graph. It was written
for the version the `llamacpp` extra pins (WRITTEN_FOR); under another, what tokenviz binds is checked as
the library loads, and what that version lacks is said in one line, never met as a traceback mid-step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenviz.contract.errors import TokenvizError

WRITTEN_FOR = "0.3.36"  # the llamacpp extra's pin (pyproject.toml)
RESULT_NORM = "result_norm"  # the final norm's output in llama.cpp's graph
# What tokenviz calls of llama.cpp's C API through llama-cpp-python's bindings (a test reads the backend's
# code and holds this list to it).
LLAMA_FUNCTIONS = (
    "LLAMA_FLASH_ATTN_TYPE_DISABLED", "LLAMA_FLASH_ATTN_TYPE_ENABLED", "ggml_abort_callback",
    "ggml_backend_sched_eval_callback",
    "llama_backend_init", "llama_batch_free", "llama_batch_init", "llama_context_default_params",
    "llama_decode", "llama_free", "llama_get_logits_ith", "llama_get_memory", "llama_init_from_model",
    "llama_log_set", "llama_memory_clear", "llama_memory_seq_cp", "llama_memory_seq_rm",
    "llama_model_default_params", "llama_model_desc", "llama_model_free", "llama_model_get_vocab",
    "llama_model_load_from_file",
    "llama_model_meta_val_str", "llama_model_n_ctx_train", "llama_model_n_embd", "llama_model_n_head",
    "llama_model_n_head_kv", "llama_model_n_layer", "llama_model_n_params", "llama_model_size",
    "llama_set_abort_callback", "llama_set_adapter_cvec", "llama_state_seq_get_data", "llama_state_seq_get_size",
    "llama_state_seq_set_data", "llama_supports_gpu_offload", "llama_token", "llama_token_to_piece",
    "llama_tokenize",
    "llama_vocab_is_control", "llama_vocab_is_eog", "llama_vocab_n_tokens",
)  # fmt: skip


def layer_output(layer: int) -> str:
    """The residual stream after `layer` in llama.cpp's graph."""
    return of_layer("l_out", layer)


def attention_probabilities(layer: int) -> str:
    """A layer's attention probabilities in llama.cpp's graph (with flash attention off)."""
    return of_layer("kq_soft_max", layer)


# An MoE layer's routing in llama.cpp's graph (llama-graph.cpp, build_moe_ffn): the router's logits; every
# expert ranked (int32; the chosen are the first k of a token's row: ffn_moe_topk is a strided view of it,
# which the callback cannot copy whole); the chosen alone (where a family chooses them itself); their
# weights, named again at each stage llama.cpp takes them through (in this order: the last a layer has is
# what its experts' outputs are scaled by); and the sigmoid gate of a shared expert (qwen2moe.cpp's kin).
ROUTER_LOGITS, RANKED_EXPERTS, CHOSEN_EXPERTS = "ffn_moe_logits", "ffn_moe_argsort", "ffn_moe_topk"
SHARED_GATE = "ffn_shexp_gate"
EXPERT_WEIGHTS = ("ffn_moe_weights", "ffn_moe_weights_softmax", "ffn_moe_weights_norm", "ffn_moe_weights_scaled")


def of_layer(name: str, layer: int) -> str:
    """A tensor's name in llama.cpp's graph at `layer`."""
    return f"{name}-{layer}"


def version() -> str:
    try:
        import llama_cpp

        return str(llama_cpp.__version__)
    except (ImportError, AttributeError):
        return "unknown"


def checked(library: Any, names: Iterable[str]) -> Any:
    """`library`, where it has every one of `names`; else one line naming what this llama-cpp-python lacks."""
    absent = [name for name in names if not hasattr(library, name)]
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise TokenvizError(
            f"llama-cpp-python {version()} lacks {', '.join(absent[:3])}{more}, which tokenviz calls: it was "
            f"written for {WRITTEN_FOR} (pip install llama-cpp-python=={WRITTEN_FOR})"
        )
    return library


def bindings() -> Any:
    """llama-cpp-python's bindings of llama.cpp's C API (ImportError where it is not installed)."""
    import llama_cpp.llama_cpp

    return checked(llama_cpp.llama_cpp, LLAMA_FUNCTIONS)


def ggml_library() -> Any:
    """ggml's library as llama-cpp-python loads it (a function a build keeps out of reach, as one that
    loads its CPU backend at run time, is an AttributeError where it is bound: ggml._bound)."""
    from llama_cpp._ggml import libggml

    return libggml
