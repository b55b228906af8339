"""A simulated vLLM engine: OpenAI API, vLLM metric names, a KV cache with prefix reuse, batching."""
