"""Data files shipped with the package (package data: `*.txt`)."""
