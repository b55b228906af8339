"""The OpenAI-compatible gateway (FastAPI): request pipeline, streaming relay, errors, metrics."""
