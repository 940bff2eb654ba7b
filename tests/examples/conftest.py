"""Fixtures for the example trainers: uninterrupted reference runs, and cleanup of every
trainer a test starts (daemons: the root conftest's ``daemons``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.examples.trainer import EXAMPLES, Trainer

STEPS = 800
SAVE_EVERY = 50
SEED = 1234


class References:
    """One uninterrupted run per example, started on first use, in the background, so it
    overlaps with the interrupted runs of the test that asked for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._runs: dict[str, tuple[Trainer, Path]] = {}

    def start(self, name: str) -> None:
        if name not in self._runs:
            export = self.root / f"{name}-final.pt"
            run = Trainer(
                EXAMPLES[name],
                self.root / name,
                "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--seed", str(SEED),
                "--export", str(export),
            )  # fmt: skip
            self._runs[name] = (run, export)

    def final(self, name: str) -> Path:
        """The exported final state of the uninterrupted run (waits for it)."""
        self.start(name)
        run, export = self._runs[name]
        out = run.finish(timeout=180)
        assert "resumed" not in out and f"finished {STEPS} steps" in out, out
        return export

    def close(self) -> None:
        for run, _ in self._runs.values():
            run.close()


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[References]:
    refs = References(tmp_path_factory.mktemp("reference"))
    yield refs
    refs.close()


@pytest.fixture
def trainers() -> Iterator[list[Trainer]]:
    """Trainers started by a test; each is killed at the end if still running."""
    started: list[Trainer] = []
    yield started
    for t in started:
        t.close()
