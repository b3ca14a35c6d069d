"""What every subcommand shares: the user-error type and the built-in simulation defaults."""

from __future__ import annotations

# The built-in run: a burst of 2,048 requests in 256 prompt groups (4,096-token system prompts)
# arriving at 64/s, more than one H200 serving Llama-3.1-8B keeps up with, and more distinct
# prefix than its KV cache holds: the regime where the waiting-queue policy decides the hit rate.
DEFAULT_WORKLOAD = "shared-prefix:groups=256,prompts=8,system_len=4096"
DEFAULT_RATE = "64"
MAIN_POLICIES = ("fcfs", "lof", "random", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def scheduler_choices() -> dict[str, list[str]]:
    """Valid values of the scheduler flags, from the registries (so --help never goes stale)."""
    from radixsched.cache.evict import EVICTION_STRATEGIES
    from radixsched.policies import POLICIES

    return {
        "schedule_policy": list(POLICIES),
        "radix_eviction_policy": list(EVICTION_STRATEGIES),
    }
