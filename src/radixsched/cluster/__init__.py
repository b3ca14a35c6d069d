"""Multi-replica pieces: routers, the prefill delayer, the host KV tier and the prefill/decode
roles of a split deployment (``cluster.disagg``) (no torch, no ray)."""
