"""Workflows the signal and reconciliation tests drive (imported by path from subprocesses)."""
