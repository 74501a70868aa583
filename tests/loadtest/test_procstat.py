"""The process sampler against real processes: CPU a busy one burns, memory one allocates, a
grandchild counted in its ancestor's tree, processes that exit. Waits poll conditions; the
sampling interval only paces them."""

from __future__ import annotations

import os
from collections.abc import Callable

from fleetfence.testing import wait_for
from loadtest.model import ProcSample
from loadtest.procstat import ProcessSampler, read_rss_mib
from tests.loadtest.helpers import Worker

SAMPLE_EVERY_S = 0.25


def test_a_busy_process_shows_cpu_and_an_idle_one_none(worker: Callable[[], Worker]) -> None:
    busy, idle = worker(), worker()
    sampler = ProcessSampler({"busy": busy.pid, "idle": idle.pid})
    busy.send("burn 3")
    seen = wait_for(
        lambda: (s := sampler.sample())["busy"].cpu_pct > 30 and s,
        10,
        "the busy worker's CPU",
        interval_s=SAMPLE_EVERY_S,
    )
    assert seen["idle"].cpu_pct < 5
    assert busy.reply() == "done"


def test_rss_rises_by_what_a_process_allocates(worker: Callable[[], Worker]) -> None:
    w = worker()
    sampler = ProcessSampler({"w": w.pid})
    before = sampler.sample()["w"].rss_mib
    assert w.ask("alloc 200") == "allocated"
    grown = sampler.sample()["w"].rss_mib - before
    assert 180 <= grown <= 230, grown


def test_a_grandchilds_memory_counts_in_its_ancestors_tree(worker: Callable[[], Worker]) -> None:
    parent = worker()
    grandchild_pid = int(parent.ask("spawn"))
    assert parent.ask("child alloc 150") == "allocated"

    sampler = ProcessSampler({"parent": parent.pid})
    tree = sampler.sample()["parent"]
    assert sampler.pids("parent") == [parent.pid, grandchild_pid]
    assert tree.rss_mib >= 150 + read_rss_mib(parent.pid) - 1

    # Watched under its own name, the grandchild counts there and not in its ancestor's tree.
    apart = ProcessSampler({"parent": parent.pid, "grandchild": grandchild_pid}).sample()
    assert apart["grandchild"].rss_mib >= 150
    assert apart["parent"].rss_mib < 100


def test_a_process_that_exits_drops_out_without_an_error(worker: Callable[[], Worker]) -> None:
    w, other = worker(), worker()
    sampler = ProcessSampler({"w": w.pid, "other": other.pid})
    assert set(sampler.sample()) == {"w", "other"}

    w.close()  # it exits, a zombie until waited for: already gone for the sampler
    wait_for(lambda: "w" not in sampler.sample(), 10, "the exited worker to drop out")
    w.proc.wait(timeout=10)
    assert set(sampler.sample()) == {"other"}
    assert sampler.names == ["other"]

    sampler.add("gone", w.pid)  # a pid that is no longer running is never reported
    assert set(sampler.sample()) == {"other"}


def test_a_reaped_childs_cpu_counts_once(worker: Callable[[], Worker]) -> None:
    """A child sampled while it burns, then reaped: the growth of its parent's cutime is its
    whole life, of which the sampler had counted most already; counted once, not twice."""
    parent = worker()
    parent.ask("spawn")
    sampler = ProcessSampler({"parent": parent.pid})
    cpu_s = 0.0

    def sampled(s: dict[str, ProcSample]) -> None:
        nonlocal cpu_s
        assert sampler.last_interval_s is not None
        cpu_s += s["parent"].cpu_pct / 100 * sampler.last_interval_s

    parent.send("child burn 1.5")

    def finished() -> bool:
        sampled(sampler.sample())
        return parent.replied()

    wait_for(finished, 20, "the child's burn", interval_s=SAMPLE_EVERY_S)
    assert parent.reply() == "done"
    assert parent.ask("reap") == "reaped"
    sampled(sampler.sample())
    assert sampler.pids("parent") == [parent.pid]
    assert 1.3 <= cpu_s <= 2.2, cpu_s  # 1.5 s burnt and a child's start-up; twice would be ~3


def test_a_child_born_and_reaped_between_two_samples_still_counts(worker: Callable[[], Worker]) -> None:
    parent = worker()
    sampler = ProcessSampler({"parent": parent.pid})
    parent.ask("spawn")
    assert parent.ask("child burn 0.5") == "done"
    assert parent.ask("reap") == "reaped"
    s = sampler.sample()["parent"]
    assert sampler.last_interval_s is not None
    assert 0.45 <= s.cpu_pct / 100 * sampler.last_interval_s <= 1.0


def test_the_load_tests_own_process_is_itself_alone(worker: Callable[[], Worker]) -> None:
    w = worker()
    sampler = ProcessSampler({"w": w.pid})
    sampler.add_self()
    own = sampler.sample()["loadtest"]
    assert sampler.pids("loadtest") == [os.getpid()]
    assert abs(own.rss_mib - read_rss_mib(os.getpid())) < 20
    assert own.cpu_pct >= 0
