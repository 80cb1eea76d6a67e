"""Textual widgets: each renders immutable snapshots only."""
