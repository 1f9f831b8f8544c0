"""Two pools of one InferenceDeployment through a real Prometheus: two replay exporters, one
playing Azure's conversations (short prompts), one Mooncake's (long prompts, shared
prefixes), scraped as two pods with the target labels Kubernetes service discovery and a
pod-label ``labelmap`` would give them. The profiler, given each pool's selector, returns
two different profiles; the deployment-wide selector (``model_name``) sees both."""

from __future__ import annotations

import time

import pytest

from kvtune.e2e.prometheus import PrometheusServer
from kvtune.e2e.traces import AZURE_TRACE as AZURE
from kvtune.e2e.traces import MOONCAKE_TRACE as MOONCAKE
from kvtune.operator.api import PrometheusSpec
from kvtune.operator.prometheus import selectors
from kvtune.operator.prometheus.profiling import ProfilingSettings, profile_from_prometheus
from kvtune.replay.exporter import Replay, ReplayServer
from kvtune.replay.instance import InstanceConfig

MODEL, NS, NAME = "llama", "llm", "bot"
WINDOW_SECONDS = 20


@pytest.mark.prometheus
def test_two_pools_get_two_profiles_from_their_own_series(
    prometheus: PrometheusServer,
) -> None:
    chat = ReplayServer(Replay(InstanceConfig(model_name=MODEL), AZURE, speed=40.0), port=0)
    # Shuffled (arrival times kept): a stationary sample of Mooncake, long from the start.
    docs = ReplayServer(Replay(InstanceConfig(model_name=MODEL),
                               MOONCAKE, speed=40.0, shuffle_seed=1), port=0)
    chat.start()
    docs.start()
    try:
        def labels(pool: str) -> dict[str, str]:
            return {"namespace": NS, "pod": f"{NAME}-{pool}-6f7d9c8b5-x2x7q",
                    "kvtune_io_deployment": NAME, "kvtune_io_pool": pool}

        prometheus.set_target_groups([([chat.target], labels("chat")),
                                      ([docs.target], labels("docs"))])
        for pool in ("chat", "docs"):
            prometheus.wait_for(
                f'sum(increase(vllm:request_success_total{{pod=~"{NAME}-{pool}-.*"}}'
                f'[{WINDOW_SECONDS}s]))', min_value=250, timeout_seconds=120)
        # Every query below must read the same samples: on a busy machine a scrape that began
        # before ``at`` can land between two of them, so let those land first (1 s scrapes).
        at = time.time()
        time.sleep(3.0)

        def profile(series: selectors.SeriesSelector) -> ProfilingSettings:
            return ProfilingSettings.for_series(series, window_seconds=WINDOW_SECONDS,
                                                min_requests=200, max_model_len_tokens=131072)

        results = {}
        for kind in ("pod", "labels"):
            prom = PrometheusSpec(url=prometheus.url, pool_selector=kind)
            for pool in ("chat", "docs"):
                series = selectors.pool_selector(prom, namespace=NS, deployment=NAME,
                                                 pool=pool)
                assert series is not None
                results[kind, pool] = profile_from_prometheus(prometheus.url, profile(series),
                                                              at_unix_seconds=at)
        wide = profile_from_prometheus(
            prometheus.url, profile(selectors.deployment_selector(MODEL)), at_unix_seconds=at)

        for r in [*results.values(), wide]:
            assert r.trusted and r.profile is not None, r.message
        short, long_ = results["pod", "chat"].profile, results["pod", "docs"].profile
        assert short is not None and long_ is not None
        # Both selectors find the same series.
        assert results["labels", "chat"].profile == short
        assert results["labels", "docs"].profile == long_
        # Azure: p50 ~1k prompt tokens, no prefix hits; Mooncake: p50 ~10k.
        assert short.context_tokens.p50 <= 2000 < 5000 <= long_.context_tokens.p50
        assert long_.context_tokens.p99 > 4 * short.context_tokens.p99
        assert short.prefix_hit_rate == 0.0
        # Shuffled, Mooncake's shared prefixes are rarely still cached: some hits, not many.
        assert long_.prefix_hit_rate is not None and long_.prefix_hit_rate > 0.0
        # The deployment-wide profile is both pools' requests, between the two.
        assert wide.profile is not None and short.requests is not None \
            and long_.requests is not None and wide.profile.requests is not None
        assert abs(wide.profile.requests - (short.requests + long_.requests)) <= 0.02 * \
            wide.profile.requests
        assert short.context_tokens.p50 < wide.profile.context_tokens.p50 \
            < long_.context_tokens.p50
        print(f"\nchat: {results['pod', 'chat'].message}\ndocs: {results['pod', 'docs'].message}"
              f"\ndeployment-wide: {wide.message}")
        # A pool with no pods of its own: no data, and the timer would fall back.
        none = profile_from_prometheus(prometheus.url, profile(selectors.pool_selector(
            PrometheusSpec(url=prometheus.url), namespace=NS, deployment=NAME,
            pool="h100")), at_unix_seconds=at)  # type: ignore[arg-type]
        assert not none.trusted and none.reason == "NoData"
    finally:
        chat.stop()
        docs.stop()
