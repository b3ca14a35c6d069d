"""``VirtualClock.jump_to`` is ``_t = max(_t, t)``: forward only, and a tie keeps the time
it had (``max`` keeps its first argument), down to its type."""

from __future__ import annotations

from radixsched.clock import VirtualClock


def test_jump_to_moves_forward_only_and_keeps_the_time_on_a_tie() -> None:
    c = VirtualClock(1.0)
    c.jump_to(0.5)
    assert c.now() == 1.0
    c.jump_to(1)  # a tie: the float stays (as max(1.0, 1) gives)
    assert c.now() == 1.0 and type(c.now()) is float
    c.jump_to(2)
    assert c.now() == 2 and type(c.now()) is int
    c.jump_to(float("nan"))  # not greater: kept, as max(2, nan) keeps 2
    assert c.now() == 2
