"""Ductor coordinator processor."""
