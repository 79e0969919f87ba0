"""Shared utilities: the project's paths and environment, file locks and atomic writes, metric tables."""
