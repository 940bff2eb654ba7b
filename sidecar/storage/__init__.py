"""Storage backends behind one interface (`sidecar.storage.base.Backend`)."""
