"""Tenants, API keys, budgets and rate limits, exact cost accounting, usage API (see `build.build_tenancy`)."""
