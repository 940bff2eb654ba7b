"""`python -m sidecar` is the `ckpt-sidecar` command."""

from sidecar.cli import main

raise SystemExit(main())
