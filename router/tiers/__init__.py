"""Tiered model routing: an alias (e.g. `auto`) resolved to a cheap or strong model per prompt."""
