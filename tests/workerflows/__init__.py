"""Workflows and a worker entry point for the multi-worker tests (run in subprocesses)."""
