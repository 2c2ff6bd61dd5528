"""Jinja2 prompt templates; a package so that they ship inside the wheel."""
