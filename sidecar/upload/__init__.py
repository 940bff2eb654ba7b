"""Uploading: retries with backoff, bandwidth caps, the worker pool."""
