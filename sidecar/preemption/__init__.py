"""Termination-notice sources: one protocol, one small poll per source, one loop."""
