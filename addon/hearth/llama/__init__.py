"""The worker side's llama.cpp layer: the adapter over llama-cpp-python, its CPU/GPU
backends, sampling, drafting and the engine backend on them. Only the model worker
(:mod:`hearth.runner`) and in-process tests load it."""
