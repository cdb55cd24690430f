"""Tests of the Hearth integration inside a real Home Assistant."""
