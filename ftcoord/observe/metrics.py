"""Prometheus / OpenMetrics from a launcher (`ftcoord-launch --metrics-port P`), with prometheus_client.

A sampler thread reads the job once a second (ftcoord.observe.job_view: read-only, its own store client) and a
scrape answers from the newest sample; no store operation happens on the training step path.

Every series carries `ftcoord_job`. Series about this launcher's own slots (restarts, heartbeat ages,
checkpoint stalls, recoveries whose witness is one of its slots) can be summed over launchers; job-wide
series (generation, world sizes, steps committed, the effective-training-time ratio) read the same on
every launcher: aggregate them with `max by (ftcoord_job)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch.distributed as dist
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ftcoord.errors import PortInUse
from ftcoord.log import get_logger
from ftcoord.observe.job_view import JobReader, JobView
from ftcoord.protocol.launcher_report import RESTART_KINDS
from ftcoord.protocol.slot_report import STALL_BUCKETS, StallCounts

SAMPLE_S = 1.0


@dataclass
class _Totals:
    """What outlives a slot's process: its predecessors' counts are kept, keyed by incarnation."""

    in_process: dict[tuple[int, int], int]
    checkpoints: dict[tuple[int, int], StallCounts]
    recoveries: StallCounts
    incidents_seen: int = 0
    steps: int = 0


class LauncherMetrics:
    """The collector behind a launcher's /metrics."""

    def __init__(self, store: dist.Store, job: str, slots: list[int],
                 restarts: Callable[[], Mapping[int, Mapping[str, int]]]) -> None:
        self._reader = JobReader(store, job)
        self._job = job
        self._slots = set(slots)
        self._restarts = restarts
        self._lock = threading.Lock()
        self._view: JobView | None = None
        self._totals = _Totals({}, {}, StallCounts())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ftcoord-metrics", daemon=True)
        self._log = get_logger(component="metrics", job_id=job)
        self.failed: BaseException | None = None

    def serve(self, port: int, host: str) -> int:
        """Start sampling and answer scrapes on host:port (0: any free port); returns the port."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        try:
            server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise PortInUse(f"cannot serve metrics on {host}:{port}: {exc.strerror}; pick another --metrics-port "
                            f"(0 picks a free one)") from None
        self._sample()
        self._thread.start()
        bound = int(server.server_address[1])
        self._log.info("metrics_serving", address=f"{host}:{bound}", path="/metrics")
        return bound

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self._sample()
            except Exception as exc:  # the store went away: scrapes answer from the last sample
                if self.failed is None:
                    self._log.warning("metrics_sample_failed", error=str(exc).splitlines()[0] if str(exc) else "")
                self.failed = exc

    def _sample(self) -> None:
        view = self._reader.read()
        incidents = self._reader.incidents
        with self._lock:
            totals = self._totals
            for incident in incidents[totals.incidents_seen:]:
                if incident.witness in self._slots:
                    totals.recoveries.observe(incident.stall_s)
            totals.incidents_seen = len(incidents)
            for slot in view.slots:
                if slot.slot not in self._slots or slot.in_process_restarts is None:
                    continue
                totals.in_process[(slot.slot, slot.incarnation)] = slot.in_process_restarts
            for slot, incarnation, stalls in self._checkpoint_stalls(view):
                totals.checkpoints[(slot, incarnation)] = stalls
            totals.steps = max(totals.steps, view.step or 0)
            self._view = view

    def _checkpoint_stalls(self, view: JobView) -> Iterator[tuple[int, int, StallCounts]]:
        for slot in view.slots:
            if slot.slot in self._slots and slot.checkpoint_stalls is not None:
                yield slot.slot, slot.incarnation, StallCounts(**{**slot.checkpoint_stalls,
                                                                  "buckets": tuple(slot.checkpoint_stalls["buckets"])})

    # -- prometheus_client's collector protocol --------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            view, totals = self._view, self._totals
            if view is None:
                return
            job = [self._job]
            yield _gauge("ftcoord_generation", "The job's current generation (membership epoch).", job,
                         view.generation)
            yield _gauge("ftcoord_world_size", "Members of the current generation.", job, view.world_size)
            yield _gauge("ftcoord_target_world_size", "The world size the job asks for.", job,
                         view.target_world_size or 0)
            restarts = CounterMetricFamily("ftcoord_restarts", "Processes of this launcher's slots replaced, by what "
                                           "ended the one before (fenced, signal, exit, job).",
                                           labels=["ftcoord_job", "slot", "kind"])
            for slot, kinds in sorted(self._restarts().items()):
                for kind in RESTART_KINDS:
                    restarts.add_metric([*job, str(slot), kind], kinds.get(kind, 0))
            yield restarts
            in_process = CounterMetricFamily("ftcoord_in_process_restarts", "Generations this launcher's slots left "
                                             "and rejoined without a new process.", labels=["ftcoord_job", "slot"])
            for slot in sorted(self._slots):
                in_process.add_metric([*job, str(slot)], sum(n for (s, _), n in totals.in_process.items() if s == slot))
            yield in_process
            yield _histogram("ftcoord_recovery_seconds", "Fault to the next committed step (an incident's stall_s, "
                             "measured by its witness; this launcher's witnesses).", job, totals.recoveries)
            ckpt = StallCounts()
            for stalls in totals.checkpoints.values():
                ckpt = ckpt.add(stalls)
            yield _histogram("ftcoord_checkpoint_stall_seconds", "Training stood still for a checkpoint "
                             "(this launcher's slots).", job, ckpt)
            steps = CounterMetricFamily("ftcoord_steps_committed", "The job's newest committed step.",
                                        labels=["ftcoord_job"])
            steps.add_metric(job, totals.steps)
            yield steps
            ages = GaugeMetricFamily("ftcoord_heartbeat_age_seconds", "How long this launcher has seen the slot's "
                                     "heartbeat unchanged (its own clock).", labels=["ftcoord_job", "slot"])
            for slot in view.slots:
                if slot.slot in self._slots:
                    ages.add_metric([*job, str(slot.slot)], slot.heartbeat_age_s)
            yield ages
            yield _gauge("ftcoord_effective_training_ratio", "Time in committed steps / wall time since the first "
                         "commit (1 - what the incidents cost / elapsed).", job,
                         view.effective_ratio if view.effective_ratio is not None else 1.0)
            lost = CounterMetricFamily("ftcoord_incident_cost_seconds", "Training time the job's incidents took "
                                       "away, together.", labels=["ftcoord_job"])
            lost.add_metric(job, view.lost_s)
            yield lost


def _gauge(name: str, doc: str, job: list[str], value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=["ftcoord_job"])
    gauge.add_metric(job, value)
    return gauge


def _histogram(name: str, doc: str, job: list[str], counts: StallCounts) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["ftcoord_job"])
    buckets = [(str(bound), float(n)) for bound, n in zip(STALL_BUCKETS, counts.buckets, strict=False)]
    family.add_metric(job, buckets + [("+Inf", float(counts.count))], counts.total)
    return family
