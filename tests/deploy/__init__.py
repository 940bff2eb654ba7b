"""Tests of the deploy files: their real validators, and the daemon's contract."""
