"""Hearth: a local LLM service for Home Assistant households."""

__version__ = "0.1.0"
