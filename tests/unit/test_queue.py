"""The bounded checkpoint queue: newest first, supersede the oldest not started, two lanes."""

from __future__ import annotations

import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.model import CheckpointReady, EntryKind, FileEntry, FileState
from sidecar.queue import CheckpointQueue


def item(
    name: str,
    step: int | None,
    size: int = 10,
    t: float = 0.0,
    kind: EntryKind = EntryKind.CHECKPOINT,
) -> CheckpointReady:
    f = FileEntry(rel=name, path=Path("/x") / name, state=FileState(size, 1, 1))
    return CheckpointReady(
        name=name,
        kind=kind,
        is_dir=False,
        files=(f,),
        step=step,
        completed_at=t,
        completed_mono=t,
    )


def test_newest_step_comes_out_first() -> None:
    q = CheckpointQueue(10, 10**9)
    for name, step in [("s_2", 2), ("s_9", 9), ("s_5", 5)]:
        assert q.put(item(name, step)) == []
    got = [q.get_checkpoint(0) for _ in range(3)]
    assert [g.name for g in got if g] == ["s_9", "s_5", "s_2"]
    assert q.get_checkpoint(0) is None


def test_ties_and_missing_steps_order_by_completion_time() -> None:
    q = CheckpointQueue(10, 10**9)
    q.put(item("last.ckpt", None, t=5.0))
    q.put(item("a_3", 3, t=1.0))
    q.put(item("b_3", 3, t=2.0))
    order = []
    while (g := q.get_checkpoint(0)) is not None:
        order.append(g.name)
    assert order == ["b_3", "a_3", "last.ckpt"]


def test_count_bound_supersedes_the_oldest_not_started() -> None:
    q = CheckpointQueue(2, 10**9)
    q.put(item("s_1", 1))
    q.put(item("s_2", 2))
    dropped = q.put(item("s_3", 3))
    assert [d.name for d in dropped] == ["s_1"]
    assert q.depth() == (2, 20, 0)
    assert q.newest() is not None and q.newest().name == "s_3"  # type: ignore[union-attr]


def test_byte_bound_supersedes_oldest_but_never_the_only_one() -> None:
    q = CheckpointQueue(10, 100)
    q.put(item("s_1", 1, size=60))
    dropped = q.put(item("s_2", 2, size=60))
    assert [d.name for d in dropped] == ["s_1"]
    assert [d.name for d in q.put(item("s_3", 3, size=500))] == ["s_2"]
    assert q.depth() == (1, 500, 0), "the newest stays even when larger than max_bytes"
    q2 = CheckpointQueue(10, 100)
    assert q2.put(item("huge_9", 9, size=10_000)) == []
    assert q2.depth() == (1, 10_000, 0)


def test_an_older_checkpoint_arriving_when_full_is_the_one_superseded() -> None:
    q = CheckpointQueue(2, 10**9)
    q.put(item("s_5", 5))
    q.put(item("s_6", 6))
    dropped = q.put(item("s_1", 1))
    assert [d.name for d in dropped] == ["s_1"]
    assert q.newest() is not None and q.newest().name == "s_6"  # type: ignore[union-attr]


def test_same_name_put_again_replaces_the_older_snapshot() -> None:
    q = CheckpointQueue(5, 10**9)
    first = item("last.ckpt", None, size=1, t=1.0)
    second = item("last.ckpt", None, size=2, t=2.0)
    q.put(first)
    assert q.put(second) == [first]
    assert q.depth() == (1, 2, 0)
    assert q.get_checkpoint(0) is second


def test_other_files_are_a_separate_fifo_lane_outside_the_bounds() -> None:
    q = CheckpointQueue(1, 10)
    for n in ("a.log", "b.yaml", "c.txt"):
        assert q.put(item(n, None, size=1000, kind=EntryKind.OTHER)) == []
    q.put(item("s_1", 1))
    assert q.depth() == (1, 10, 3)
    assert q.get_other(0).name == "a.log"  # type: ignore[union-attr]
    assert q.get_other(0).name == "b.yaml"  # type: ignore[union-attr]
    assert q.get_checkpoint(0).name == "s_1"  # type: ignore[union-attr]


def test_drain_keeps_only_the_newest() -> None:
    q = CheckpointQueue(10, 10**9)
    for s in (3, 8, 1):
        q.put(item(f"s_{s}", s))
    dropped = q.supersede_all_but_newest()
    assert sorted(d.name for d in dropped) == ["s_1", "s_3"]
    assert q.depth()[0] == 1
    assert q.get_checkpoint(0).name == "s_8"  # type: ignore[union-attr]
    assert q.supersede_all_but_newest() == []


def test_get_blocks_until_a_put_from_another_thread() -> None:
    q = CheckpointQueue(4, 10**9)
    got: list[CheckpointReady | None] = []
    waiting = threading.Event()

    def consumer() -> None:
        waiting.set()
        got.append(q.get_checkpoint(timeout=10))

    th = threading.Thread(target=consumer)
    th.start()
    assert waiting.wait(5)
    q.put(item("s_4", 4))
    th.join(10)
    assert not th.is_alive()
    assert got and got[0] is not None and got[0].name == "s_4"


def test_close_wakes_a_blocked_get_with_none() -> None:
    q = CheckpointQueue(4, 10**9)
    got: list[CheckpointReady | None] = []
    th = threading.Thread(target=lambda: got.append(q.get_other(timeout=30)))
    th.start()
    q.close()
    th.join(10)
    assert not th.is_alive()
    assert got == [None]


def test_get_times_out_with_none() -> None:
    q = CheckpointQueue(4, 10**9)
    assert q.get_checkpoint(timeout=0.01) is None


@given(
    st.lists(
        st.tuples(
            st.integers(0, 6),  # name index
            st.one_of(st.none(), st.integers(0, 50)),
            st.integers(1, 100),
        ),
        max_size=40,
    ),
    st.integers(1, 5),
    st.integers(1, 300),
)
@settings(max_examples=200, deadline=None, database=None)
def test_every_put_is_queued_or_reported_and_the_newest_survives(
    puts: list[tuple[int, int | None, int]], max_n: int, max_bytes: int
) -> None:
    q = CheckpointQueue(max_n, max_bytes)
    live: dict[str, CheckpointReady] = {}
    for t, (idx, step, size) in enumerate(puts):
        it = item(f"c{idx}", step, size=size, t=float(t))
        live[it.name] = it  # a snapshot put again replaces the older one of that name
        newest = max(live.values(), key=_age)
        dropped = q.put(it)
        for d in dropped:
            assert d is not newest, "the newest checkpoint was superseded"
            if live.get(d.name) is d:
                del live[d.name]
        n, nbytes, _ = q.depth()
        assert n == len(live), "an item vanished without being reported superseded"
        assert n <= max_n
        assert n == 1 or nbytes <= max_bytes
        assert q.newest() is newest


def _age(i: CheckpointReady) -> tuple[int, float]:
    return (i.step if i.step is not None else -1, i.completed_mono)
