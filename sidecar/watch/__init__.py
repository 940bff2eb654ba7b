"""Watching the checkpoint folder and deciding when an entry is complete."""
