"""The new-token ratio: how much of its remaining decode budget a running request is expected
to use, for reserving KV memory at admission."""

from __future__ import annotations

from radixsched.config import SchedulerConfig


class NewTokenRatioTracker:
    def __init__(self, config: SchedulerConfig) -> None:
        self.init = min(config.init_new_token_ratio * config.schedule_conservativeness, 1.0)
        self.min = min(self.init * config.min_new_token_ratio_factor, 1.0)
        self.decay = (self.init - self.min) / config.new_token_ratio_decay_steps
        self.current = self.init
        self.compat = config.sglang_compat

    def decay_steps(self, n: int = 1) -> None:
        """``n`` decode steps without retraction. Applied one step at a time, so that a
        simulator jumping over ``n`` steps rounds exactly as ``n`` single steps do."""
        cur, dec, lo = self.current, self.decay, self.min
        for _ in range(n):
            if cur <= lo and dec >= 0:
                break  # at the floor: further steps change nothing
            cur = max(cur - dec, lo)
        self.current = cur

    def reset(self) -> None:
        self.current = self.init

    def after_retraction(self, estimate: float) -> None:
        # SGLang assigns the survivors' estimate, which can drop the ratio right after running
        # out of memory; radixsched never lowers it on a retraction.
        self.current = estimate if self.compat else max(self.current, estimate)
