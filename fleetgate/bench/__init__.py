"""Benchmarks (commands, not tests): gateway overhead, routing policies, the cost report."""
