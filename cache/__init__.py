"""Exact and semantic response caches behind one `ResponseCache` protocol. Pure: no web framework."""
