"""Metrics, benchmark runners and plots."""
