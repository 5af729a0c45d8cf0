"""Backends of consensus-api, one package per store, found by entry point."""
