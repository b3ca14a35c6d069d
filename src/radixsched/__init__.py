"""radixsched: cache-aware request scheduling for LLM serving."""

__version__ = "0.1.0"
