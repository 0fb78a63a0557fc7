"""What a GGUF in llama.cpp cannot take, and why, in the words the user reads (one line each)."""

NO_ABLATION = (
    "a head of a GGUF in llama.cpp cannot be ablated here: its heads meet inside llama.cpp's attention, where "
    "tokenviz's control vectors and patches do not reach (they change the residual stream); run it on the "
    "transformers backend (drop --backend llama.cpp), which dequantizes the same GGUF"
)
ON_TRANSFORMERS = "--backend transformers runs the same GGUF with it"
LACKS_WHY = {  # what llama.cpp does not give, why, and what does (ModelInfo.lacks_why)
    "head ablation": "llama.cpp computes a layer's heads together inside its attention, where tokenviz cannot "
    f"reach one head; {ON_TRANSFORMERS}",
    "leave-one-out": "tokenviz does not run leave-one-out on llama.cpp (a pass of the context for each token "
    f"left out); {ON_TRANSFORMERS}",
    "attribution": f"llama.cpp computes no gradients, which gradient × input needs; {ON_TRANSFORMERS}",
    "logit split": "llama.cpp does not give each layer's attention and MLP outputs apart, which the split "
    f"needs; {ON_TRANSFORMERS}",
}
NO_GPU_BUILD = (
    "this llama-cpp-python was built for the CPU alone, so no layer can be offloaded: drop --gpu-layers, or build "
    'it for the GPU (for an NVIDIA GPU: CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python)"
)
NO_LAYER_0 = (
    "llama.cpp's control vectors start after layer 1 (it keeps none for layer 0): steer a layer from 1, or run "
    "it on the transformers backend (drop --backend llama.cpp)"
)
