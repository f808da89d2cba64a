"""Drafting schemes."""
