"""HTTP only: what the OpenAI, Ollama and Hearth routes share (errors, auth, bodies, model
names), and the Ollama routes. The routes translate to the requests of
:mod:`hearth.chat.completions`, the one place that builds prompts and grammars."""
