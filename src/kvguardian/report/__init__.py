"""Sinks that render findings and reports: terminal text (rich) and JSON. They never mutate the ledger."""
