"""`/metrics` series of the served folder watchers (indexer/watch/health.py), read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from indexer.watch.health import WatchHealth


class WatchCollector(Collector):
    def __init__(self, health: WatchHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        labels = ["collection", "folder"]
        up = GaugeMetricFamily("cnclip_watcher_up", "1 while a folder watcher runs, 0 while it is down.", labels=labels)
        here = GaugeMetricFamily(
            "cnclip_watcher_folder_here",
            "1 while a watcher's folder is at its path (0: gone, replaced or unreadable; nothing is pruned).",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            "cnclip_watcher_restarts", "Folder watchers restarted after a failure.", labels=labels
        )
        for w in list(self.health.watchers.values()):
            values = [w.collection, w.folder]
            up.add_metric(values, 1.0 if w.up else 0.0)
            here.add_metric(values, 1.0 if w.folder_here else 0.0)
            restarts.add_metric(values, float(w.restarts))
        yield up
        yield here
        yield restarts
