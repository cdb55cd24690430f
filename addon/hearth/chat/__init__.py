"""The chat layer: request bodies, prompts, tools and their grammars, call forcing,
schema limits and reasoning; :mod:`.completions` turns a request into engine work."""
