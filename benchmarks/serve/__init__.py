"""specbound serve against llama-cpp-python's server."""
