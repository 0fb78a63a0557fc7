"""The llama.cpp backend: a GGUF stepped in llama.cpp in this process, in its own quantization, through
llama-cpp-python (runtime.py: its C API; engine.py: the engine; plugin.py: its options and loader)."""
