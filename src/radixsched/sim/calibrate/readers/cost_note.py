"""The one line said of a run whose prompts' prefix structure the file does not record."""

from __future__ import annotations

# What replaying request-unique prompts costs when the benchmark shared prefixes.
UNKNOWN_COST = (
    "replayed with request-unique prompts; if the benchmark's prompts shared prefixes, the "
    "fit takes the server's cache hits for faster prefill (give --workload SPEC with the "
    "prompts it sent)"
)


def unknown_structure(what: str) -> str:
    return f"{what}: {UNKNOWN_COST}"
