"""Fixers propose edits for one bug: a model through litellm, a cassette, or a recipe."""
