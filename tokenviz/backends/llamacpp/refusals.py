"""What a GGUF in llama.cpp cannot take, and why, in the words the user reads (one line each)."""

NO_ABLATION = (
    "a head of a GGUF in llama.cpp cannot be ablated here: its heads meet inside llama.cpp's attention, where "
    "tokenviz's control vectors and patches do not reach (they change the residual stream); run it on the "
    "transformers backend (drop --backend llama.cpp), which dequantizes the same GGUF"
)
NO_LAYER_0 = (
    "llama.cpp's control vectors start after layer 1 (it keeps none for layer 0): steer a layer from 1, or run "
    "it on the transformers backend (drop --backend llama.cpp)"
)
