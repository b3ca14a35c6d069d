"""Clients of a running server: the load client behind ``radixsched bench``."""
