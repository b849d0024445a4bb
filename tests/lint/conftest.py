"""Fixtures under ``fixtures/`` are data for the linter: they are never imported or collected."""
collect_ignore_glob = ["fixtures/*"]
