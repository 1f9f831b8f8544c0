"""The worker side of vLLM 0.33.0's ``OffloadingConnector``, as the oracle needs it: when
the CPU tier's transfers finish, under kvtune's host-link model.

vLLM's scheduler-side connector (``offloading/scheduler.py``: lookups, the LRU, which
chunks to store and load) runs unchanged inside the oracle's scheduler; only the GPU copy
kernels are missing. This stands in for ``OffloadingConnectorWorker`` (``offloading/
worker.py``) and ``CPUOffloadingWorker`` (``kv_offload/cpu/gpu_worker.py``), following them:

- a step's load jobs are submitted when the step starts (``start_kv_transfers``); its store
  jobs are deferred to the start of the *next* step (``prepare_store_kv``: "so that
  offloading starts AFTER transfers related to token sampling"), except the ones the
  scheduler asks to flush (``handle_preemptions``), submitted at once;
- each direction is one ordered queue (``SingleDirectionOffloadingHandler``: a transfer
  starts after the one before it): a transfer of ``n`` chunks takes ``n`` x the seconds one
  chunk takes over the host link (``gpus.json`` ``host_link_bytes_per_second``, the same
  figure for both directions);
- the worker reports the transfers done by the end of a step with that step's output
  (``get_finished`` after the forward pass): the finished loads' request ids
  (``finished_recving``) and every finished job's id (``OffloadingWorkerMetadata``).

Pure (no vLLM import): ``vllm_engine`` turns what ``finished`` returns into vLLM's output
types.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Transfer:
    job_id: int
    done_seconds: float
    request_id: str | None  # a load's request; None for a store


@dataclass(slots=True)
class HostLinkWorker:
    """The transfers in flight, one queue per direction."""

    seconds_per_chunk: float
    load_free_seconds: float = 0.0
    store_free_seconds: float = 0.0
    _deferred_stores: list[tuple[int, int]] = field(default_factory=list)  # (job, chunks)
    _in_flight: list[_Transfer] = field(default_factory=list)

    def _store(self, start_seconds: float, job_id: int, num_chunks: int) -> None:
        begin = max(start_seconds, self.store_free_seconds)
        self.store_free_seconds = begin + num_chunks * self.seconds_per_chunk
        self._in_flight.append(_Transfer(job_id, self.store_free_seconds, None))

    def start_step(self, start_seconds: float, loads: list[tuple[int, str, int]],
                   stores: list[tuple[int, int]], flush: set[int]) -> None:
        """A step starts at ``start_seconds`` with its connector metadata: ``loads``
        (job, request id, chunks), ``stores`` (job, chunks), the jobs to ``flush``."""
        for job_id, num_chunks in self._deferred_stores:
            self._store(start_seconds, job_id, num_chunks)
        self._deferred_stores = []
        for job_id, num_chunks in stores:
            if job_id in flush:
                self._store(start_seconds, job_id, num_chunks)
        for job_id, request_id, num_chunks in loads:
            begin = max(start_seconds, self.load_free_seconds)
            self.load_free_seconds = begin + num_chunks * self.seconds_per_chunk
            self._in_flight.append(_Transfer(job_id, self.load_free_seconds, request_id))
        self._deferred_stores = [(j, n) for j, n in stores if j not in flush]

    def finished(self, end_seconds: float) -> tuple[set[str], dict[int, int]]:
        """The transfers done by ``end_seconds`` (a step's end): the loads' request ids
        and every job's completion count (one worker)."""
        done = [t for t in self._in_flight if t.done_seconds <= end_seconds]
        if not done:
            return set(), {}
        self._in_flight = [t for t in self._in_flight if t.done_seconds > end_seconds]
        recving = {t.request_id for t in done if t.request_id is not None}
        return recving, {t.job_id: 1 for t in done}

    def next_done_seconds(self) -> float | None:
        """When the next transfer in flight finishes (None: none is, or only stores not
        yet submitted, which the next step submits)."""
        return min((t.done_seconds for t in self._in_flight), default=None)

    @property
    def busy(self) -> bool:
        return bool(self._in_flight or self._deferred_stores)
