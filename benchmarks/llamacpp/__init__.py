"""The llama.cpp backend: decoding against llama-cpp-python, batch invariance, shared-prefix prefill."""
