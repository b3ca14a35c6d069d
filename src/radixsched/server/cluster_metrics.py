"""One scrape for a whole ``serve --dp-size`` cluster: every worker's Prometheus metrics with a
``worker`` label, the counters (and histograms) summed over the workers as ``worker="all"``, and
``radixsched_cluster_worker_up`` per worker. Served by the launcher on ``--metrics-port``; each
scrape asks the workers afresh (nothing is cached, so a scrape never shows stale totals)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from radixsched.server.metrics import PREFIX

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

UP = f"{PREFIX}_cluster_worker_up"
# Families whose samples add up across workers (a gauge does not: a sum of KV usages means nothing).
SUMMED = ("counter", "histogram", "summary")

Fetch = Callable[[str], "str | None"]
Labels = tuple[tuple[str, str], ...]


def fetch_text(url: str, timeout: float = 2.0) -> str | None:
    """``url``'s body, or None when the worker does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bytes(r.read()).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: Labels, value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{name}{{{inner}}} {value!r}" if inner else f"{name} {value!r}"


class _Families:
    """Samples by family, in first-seen order, with their help and type."""

    def __init__(self) -> None:
        self.meta: dict[str, tuple[str, str]] = {}
        self.samples: dict[str, list[tuple[str, Labels, float]]] = {}
        self.totals: dict[str, dict[tuple[str, Labels], float]] = {}

    def add(self, family: Metric, worker: str) -> None:
        name, kind = family.name, family.type
        self.meta.setdefault(name, (family.documentation, kind))
        rows = self.samples.setdefault(name, [])
        totals = self.totals.setdefault(name, {})
        for s in family.samples:
            labels = tuple(sorted(s.labels.items()))
            rows.append((s.name, (("worker", worker), *labels), float(s.value)))
            if kind in SUMMED:
                key = (s.name, labels)
                totals[key] = totals.get(key, 0.0) + float(s.value)

    def text(self) -> str:
        out: list[str] = []
        for name, (help_text, kind) in self.meta.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            out += [_line(n, labels, v) for n, labels, v in self.samples[name]]
            for (n, labels), v in self.totals[name].items():
                out.append(_line(n, (("worker", "all"), *labels), v))
        return "\n".join(out) + "\n"


def cluster_metrics(worker_urls: Sequence[str], fetch: Fetch = fetch_text) -> str:
    """The cluster's Prometheus text: each worker's samples labelled with its URL, the summed
    families' totals as ``worker="all"``, and whether each worker answered."""
    from prometheus_client.parser import text_string_to_metric_families

    families = _Families()
    up: list[str] = [f"# HELP {UP} Whether the worker answered this scrape.", f"# TYPE {UP} gauge"]
    for url in worker_urls:
        text = fetch(url.rstrip("/") + "/metrics")
        parsed = []
        if text is not None:
            try:
                parsed = list(text_string_to_metric_families(text))
            except ValueError:
                text = None
        up.append(_line(UP, (("worker", url),), 0.0 if text is None else 1.0))
        for family in parsed:
            families.add(family, url)
    return families.text() + "\n".join(up) + "\n"


def serve_cluster_metrics(host: str, port: int, worker_urls: Sequence[str]) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` for ``worker_urls`` on a daemon thread; the caller shuts the
    returned server down."""
    urls = tuple(worker_urls)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = cluster_metrics(urls).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="cluster-metrics", daemon=True).start()
    return server
