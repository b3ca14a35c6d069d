"""``radixsched plan``: the cheapest deployment that meets latency targets on a workload.

- ``space``: the search space (GPU, TP, replicas, policy, router, split deployments, any
  scheduler or simulator setting given as a list) expanded into candidates, and the ones that
  cannot run (a model that does not fit, a request longer than the KV pool) pruned with the
  reason;
- ``pricing``: GPU-hour prices (the presets' list prices, overridable);
- ``capacity``: the highest request rate a candidate sustains within the SLOs, by bisection
  over the rate to a stated tolerance, and the roofline bound that stops hopeless candidates;
- ``search``: one candidate's capacity search over the workload loaded once per process, and
  the pools that run candidates (forked processes, or Ray);
- ``planner``: the order of work: pruning, most promising first, early stops;
- ``result``: the result types, ranking, the recommendation's reasons and the JSON;
- ``table``: the table and recommendation as text; ``report``: the HTML report (capacity
  against cost, latency against rate)."""
