"""Scheduling plugins: filters, scorers, pickers, producers and observers, one per module."""
