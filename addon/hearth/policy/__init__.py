"""Policy in plain Python (no llama.cpp): what the engine's mechanics ask before they act."""
