"""Benchmark of `transition` against baselines measured in the same process.

Baselines: an empty function call; a plain
dict lookup of the same table, ``TABLE[state, cause_kind]`` (state class and a
cause-kind string, the key built at the call); and that lookup failing with
``KeyError`` raised and caught. Every legal row of the table is timed, and
every illegal pair; the report gives the mean and the worst.

Targets: a legal transition at most 2.5x the dict lookup; an illegal one
(raise and catch IllegalTransition) at most 3x the failing dict lookup; a live
attempt's state costs one reference. Ratios, not absolute times, are the
result: the machines are shared and noisy. Each figure is the best of several
repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
import tracemalloc
from collections.abc import Callable

from attempt_kernel import Cancel, IllegalTransition, Running, transition
from attempt_kernel._attempt import ALL_CAUSES, ALL_STATES

NUMBER = 100_000
REPEAT = 5


def _legal_call(state: object, cause: object) -> Callable[[], object]:
    return lambda: transition(state, cause)  # type: ignore[arg-type]  # loop vars are object


def _illegal_call(state: object, cause: object) -> Callable[[], object]:
    def call() -> object:
        try:
            return transition(state, cause)  # type: ignore[arg-type]  # loop vars are object
        except IllegalTransition:
            return None

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--number", type=int, default=NUMBER, help=f"calls per repeat (default {NUMBER:,})")
    parser.add_argument("--repeat", type=int, default=REPEAT, help=f"repeats, the best kept (default {REPEAT})")
    args = parser.parse_args()
    number: int = args.number
    repeat: int = args.repeat

    def best_ns(func: Callable[[], object]) -> float:
        return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e9

    # The table as a dict, keyed TABLE[state, cause_kind].
    table: dict[tuple[type, str], object] = {}
    legal: list[tuple[object, object]] = []
    illegal: list[tuple[object, object]] = []
    for s in ALL_STATES:
        for c in ALL_CAUSES:
            try:
                table[type(s), repr(c)] = transition(s, c)
                legal.append((s, c))
            except IllegalTransition:
                illegal.append((s, c))
    hit_state, hit_kind = Running, repr(Cancel(intent_dispatched=True))
    miss_state, miss_kind = Running, "Admit()"

    def empty() -> None:
        pass

    def dict_hit() -> object:
        return table[hit_state, hit_kind]

    def dict_miss() -> object:
        try:
            return table[miss_state, miss_kind]
        except KeyError:
            return None

    base_empty = best_ns(empty)
    base_hit = best_ns(dict_hit)
    base_miss = best_ns(dict_miss)
    legal_ns = {f"{type(s).__name__} + {c!r}": best_ns(_legal_call(s, c)) for s, c in legal}
    illegal_ns = {f"{type(s).__name__} + {c!r}": best_ns(_illegal_call(s, c)) for s, c in illegal}

    print(f"Python {sys.version.split()[0]} ({sys.executable}); best of {repeat} x {number:,} calls each")
    print(f"  empty function call                      {base_empty:7.1f} ns")
    print(f"  dict lookup TABLE[state, cause_kind]     {base_hit:7.1f} ns")
    print(f"  dict lookup failing (KeyError caught)    {base_miss:7.1f} ns")
    print("  legal rows:")
    for name, ns in legal_ns.items():
        print(f"    {name:<48} {ns:7.1f} ns  {ns / base_hit:5.2f}x dict")
    worst_illegal = max(illegal_ns, key=lambda k: illegal_ns[k])
    legal_mean = statistics.fmean(legal_ns.values()) / base_hit
    legal_worst = max(legal_ns.values()) / base_hit
    illegal_mean = statistics.fmean(illegal_ns.values()) / base_miss
    illegal_worst = illegal_ns[worst_illegal] / base_miss
    print(f"  illegal pairs: {len(illegal_ns)}, worst {worst_illegal} {illegal_ns[worst_illegal]:.1f} ns")
    print(f"legal   / dict hit : mean {legal_mean:.2f}x, worst {legal_worst:.2f}x (target <= 2.5x)")
    print(f"illegal / dict miss: mean {illegal_mean:.2f}x, worst {illegal_worst:.2f}x (target <= 3.0x)")

    # Memory: a live attempt's state is a reference to one shared instance.
    running = Running()
    cancel = Cancel(intent_dispatched=False)
    tracemalloc.start()
    states = [transition(running, cancel) for _ in range(100_000)]
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    distinct = len({id(s) for s in states})
    print(
        f"memory: 100,000 results are {distinct} distinct object(s); "
        f"{allocated / len(states):.1f} bytes per attempt (the list's reference)"
    )
    met = legal_worst <= 2.5 and illegal_worst <= 3.0 and distinct == 1
    print("all targets met" if met else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
