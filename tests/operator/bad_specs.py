"""The bad-spec corpus (issue 11 item 6): each case with its expected outcome.

- ``admission``: the API server refuses the object (the CRD's schema and CEL rules); the
  needles are in its error.
- ``strict``: an unknown (typo'd) field, refused with ``fieldValidation=Strict`` (what
  ``kubectl apply`` sends by default, and ``--validate=strict``); with the client default
  (``Warn``) the server prunes it and says so in a warning.
- ``degraded``: accepted, then the reconcile sets ``Degraded=True`` with ``reason`` and a
  message holding the needles (field, value, fix), and the runtime already running is left
  as it was.
- ``accepted``: a value at the edge of its bounds, admitted and applied as written (the
  Deployment carries ``deployment``'s fields), not Degraded.

A ``strict`` case stored under ``Warn`` (the field pruned) with the
``kubectl.kubernetes.io/last-applied-configuration`` a client-side apply writes is also
``Degraded``/InvalidSpec naming the dropped field (operator/api/dropped_fields.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Spec = dict[str, Any]

BASE: Spec = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workload": {"profile": "chat",
                 "contextTokens": {"p50": 2000, "p95": 8000, "p99": 16000, "max": 32768},
                 "outputTokens": {"p50": 300, "p99": 2000}},
    "pools": [{"gpuClass": "H100", "name": "h100", "replicas": 1}],
    "tuning": {"mode": "auto"},
}

# A prefill/decode pair (issue 26): the decode pool names its prefill pool.
_PREFILL: Spec = {"gpuClass": "H100", "name": "pre", "replicas": 1, "role": "prefill"}
_DECODE: Spec = {"gpuClass": "H100", "name": "dec", "replicas": 1, "role": "decode",
                 "prefillPool": "pre"}

TEMPLATE_DIVIDES_BY_ZERO = "spec:\n  containers:\n    - name: vllm\n      image: {{1/0}}\n"
TEMPLATE_NOT_A_POD = "- just\n- a list\n"
_POD = ("metadata: {{labels: {{{{ pod_labels | tojson }}}}}}\nspec:\n  containers:\n"
        "    - {{name: vllm, image: {image}, args: {{{{ args | tojson }}}}}}\n{extra}")
TEMPLATE_IMAGE = _POD.format(image="evil.example/miner:1", extra="")
TEMPLATE_LABEL = ("metadata: {labels: {kvtune.io/deployment: someone-else}}\nspec:\n"
                  "  containers: [{name: vllm, image: {{ image | tojson }}}]\n")
TEMPLATE_BAD_LABEL = TEMPLATE_LABEL.replace("kvtune.io/deployment: someone-else", "team: 'a b'")
TEMPLATE_SECRET = _POD.format(image="{{ image | tojson }}",
                              extra="  volumes: [{name: db, secret: {secretName: db}}]\n")


@dataclass(frozen=True)
class BadSpec:
    id: str
    change: Callable[[Spec], None]
    expect: Literal["admission", "strict", "degraded", "accepted"]
    needles: tuple[str, ...]
    reason: str | None = None  # the Degraded reason
    name: str | None = None  # metadata.name, when the name is the bad part
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> data
    # accepted: Deployment fields (dotted path under .spec) and their expected values
    deployment: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> Spec:
        spec = copy.deepcopy(BASE)
        self.change(spec)
        return spec


def at(path: str, value: Any) -> Callable[[Spec], None]:
    """Set ``a.b.0.c`` (creating maps on the way)."""
    def change(spec: Spec) -> None:
        node: Any = spec
        keys = path.split(".")
        for key in keys[:-1]:
            nxt = int(key) if isinstance(node, list) else key
            if isinstance(node, dict) and key not in node:
                node[key] = {}
            node = node[nxt]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def drop(path: str) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        node: Any = spec
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[int(key) if isinstance(node, list) else key]
        del node[keys[-1]]
    return change


def both(*changes: Callable[[Spec], None]) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        for c in changes:
            c(spec)
    return change


def _adm(id_: str, change: Callable[[Spec], None], *needles: str,
         name: str | None = None) -> BadSpec:
    return BadSpec(id_, change, "admission", needles, name=name)


def _deg(id_: str, change: Callable[[Spec], None], reason: str, *needles: str,
         config_maps: dict[str, dict[str, str]] | None = None) -> BadSpec:
    return BadSpec(id_, change, "degraded", needles, reason=reason,
                   config_maps=config_maps or {})


def _noop(_: Spec) -> None:
    pass


CASES: list[BadSpec] = [
    # --- the model -------------------------------------------------------------------------
    _adm("model-named-like-a-flag", at("model.name", "--trust-remote-code"), "spec.model.name"),
    _adm("model-dash", at("model.name", "-m"), "spec.model.name"),
    _adm("model-with-space", at("model.name", "llama 3 8b"), "spec.model.name"),
    _adm("model-empty", at("model.name", ""), "spec.model.name"),
    _adm("model-too-long", at("model.name", "m" * 300), "spec.model.name"),
    _adm("model-shell", at("model.name", "llama;rm -rf /"), "spec.model.name"),
    _adm("weights-dtype-unknown", at("model.weightsDtype", "fp7"), "weightsDtype"),
    _adm("model-config-map-bad-name", at("model.config", {"configMapRef": {"name": "Bad_Name"}}),
         "configMapRef.name"),
    _adm("model-missing", drop("model"), "model"),
    # --- the runtime -----------------------------------------------------------------------
    _adm("image-with-flag", at("runtime.image", "vllm/vllm-openai:v0.33.0 --trust-remote-code"),
         "spec.runtime.image"),
    _adm("image-upper-case", at("runtime.image", "VLLM/Openai:latest"), "spec.runtime.image"),
    _adm("image-empty", at("runtime.image", ""), "spec.runtime.image"),
    _adm("image-double-colon", at("runtime.image", "vllm/vllm-openai::v1"),
         "spec.runtime.image"),
    _adm("image-bad-digest", at("runtime.image", "vllm/vllm-openai@sha256:xyz"),
         "spec.runtime.image"),
    _adm("vllm-version-latest", at("runtime.vllmVersion", "latest"), "vllmVersion"),
    _adm("entrypoint-bash", at("runtime.entrypoint", "bash"), "entrypoint"),
    _adm("pod-template-bad-ref", at("runtime.podTemplate", {"configMapRef": {"name": "A B"}}),
         "podTemplate.configMapRef.name"),
    # --- the workload ----------------------------------------------------------------------
    _adm("preset-unknown", at("workload.profile", "batch"), "workload.profile"),
    _adm("context-p50-zero", at("workload.contextTokens.p50", 0), "contextTokens.p50"),
    _adm("context-p50-above-p99", at("workload.contextTokens.p50", 20000), "p50 must not exceed"),
    _adm("context-p99-above-max", at("workload.contextTokens.max", 10000),
         "p99 must not exceed max"),
    _adm("context-p50-above-p95", at("workload.contextTokens.p95", 1000),
         "p50 must not exceed p95"),
    _adm("output-negative", at("workload.outputTokens.p50", -5), "outputTokens.p50"),
    _adm("concurrency-zero", at("workload.concurrentSequences", 0), "concurrentSequences"),
    _adm("shared-prefix-negative", at("workload.sharedPrefixTokens", -1), "sharedPrefixTokens"),
    _adm("context-ten-billion", at("workload.contextTokens.max", 10**10), "contextTokens.max"),
    # --- SLOs and quality ------------------------------------------------------------------
    _adm("ttft-zero", at("slo", {"ttftP95": "0s"}), "slo.ttftP95 must be above 0s"),
    _adm("tpot-zero", at("slo", {"tpotP95": "0ms"}), "slo.tpotP95 must be above 0s"),
    _adm("ttft-words", at("slo", {"ttftP95": "fast"}), "slo.ttftP95"),
    _adm("ttft-negative", at("slo", {"ttftP95": "-1s"}), "slo.ttftP95"),
    _adm("quality-unknown", at("quality", {"lowestKVPrecision": "fp2"}), "lowestKVPrecision"),
    # --- pools -----------------------------------------------------------------------------
    _adm("no-pools", at("pools", []), "spec.pools"),
    _adm("nine-pools", at("pools", [{"gpuClass": "H100", "name": f"p{i}"} for i in range(9)]),
         "spec.pools"),
    _adm("gpu-class-empty", at("pools.0.gpuClass", ""), "gpuClass"),
    _adm("gpu-class-shell", at("pools.0.gpuClass", "H100;rm"), "gpuClass"),
    _adm("pool-named-canary", at("pools.0.name", "h200-canary"), "must not end in -canary"),
    _adm("gpu-class-canary", both(drop("pools.0.name"), at("pools.0.gpuClass", "H200-canary")),
         "must not end in -canary"),
    _adm("pool-name-upper", at("pools.0.name", "H100"), "pools[0].name"),
    _adm("pool-name-long", at("pools.0.name", "p" * 21), "pools[0].name"),
    _adm("replicas-negative", at("pools.0.replicas", -1), "replicas"),
    _adm("replicas-thousand", at("pools.0.replicas", 1000), "replicas"),
    _adm("tensor-parallel-three", at("pools.0.tensorParallel", 3), "tensorParallel"),
    _adm("pools-same-name", at("pools", [{"gpuClass": "H100"}, {"gpuClass": "h100"}]),
         "pool names must be unique"),
    _adm("toleration-operator", at("pools.0.tolerations", [{"operator": "Maybe"}]),
         "operator"),
    _adm("node-selector-huge", at("pools.0.nodeSelector", {f"k{i}": "v" for i in range(17)}),
         "nodeSelector"),
    # --- tuning ----------------------------------------------------------------------------
    _adm("mode-unknown", at("tuning.mode", "yolo"), "tuning.mode"),
    _adm("block-size-24", at("tuning.pin", {"blockSize": 24}), "multiple of 16"),
    _adm("block-size-8", at("tuning.pin", {"blockSize": 8}), "blockSize"),
    _adm("utilization-above-one", at("tuning.pin", {"gpuMemoryUtilization": 1.5}),
         "gpuMemoryUtilization"),
    _adm("utilization-zero", at("tuning.pin", {"gpuMemoryUtilization": 0}),
         "gpuMemoryUtilization"),
    _adm("utilization-and-bytes", at("tuning.pin", {"gpuMemoryUtilization": 0.9,
                                                    "kvCacheMemoryBytes": 10**10}),
         "not both"),
    _adm("kv-dtype-unknown", at("tuning.pin", {"kvCacheDtype": "int3"}), "kvCacheDtype"),
    _adm("kv-dtype-below-floor", both(at("quality", {"lowestKVPrecision": "bf16"}),
                                      at("tuning.pin", {"kvCacheDtype": "fp8"})),
         "narrower than quality.lowestKVPrecision"),
    _adm("max-model-len-one", at("tuning.pin", {"maxModelLen": 1}),
         "maxModelLen is below workload.contextTokens.max"),
    _adm("max-num-seqs-zero", at("tuning.pin", {"maxNumSeqs": 0}), "maxNumSeqs"),
    _adm("batched-tokens-zero", at("tuning.pin", {"maxNumBatchedTokens": 0}),
         "maxNumBatchedTokens"),
    _adm("offload-a-petabyte", at("tuning.pin", {"kvOffloadingSizeGiB": 10**6}),
         "kvOffloadingSizeGiB"),
    # LMCache's disk and remote tiers (issue 27): a store lmcache 0.5.6 can reach, host and
    # port; a size without a store; no zero disk.
    _adm("kv-tier-remote-http", at("tuning.kvTiers", {"remoteUrl": "http://cache:80"}),
         "remoteUrl", "lm://host:port"),
    _adm("kv-tier-remote-no-port", at("tuning.kvTiers", {"remoteUrl": "lm://lmcache"}),
         "remoteUrl", "lm://host:port"),
    _adm("kv-tier-remote-credentials",
         at("tuning.kvTiers", {"remoteUrl": "redis://admin:secret@redis:6379"}),
         "remoteUrl", "lm://host:port"),
    _adm("kv-tier-remote-size-alone", at("tuning.kvTiers", {"remoteGiB": 64}), "remoteGiB",
         "remoteUrl"),
    _adm("kv-tier-disk-zero", at("tuning.kvTiers", {"diskGiB": 0}), "diskGiB"),
    _adm("attention-backend-unknown", at("tuning.pin", {"attentionBackend": "XFORMERS"}),
         "attentionBackend"),
    _adm("prometheus-file-url", at("tuning.prometheus", {"url": "file:///etc/passwd"}),
         "prometheus.url"),
    _adm("prometheus-gopher", at("tuning.prometheus", {"url": "gopher://x:70"}),
         "prometheus.url"),
    _adm("prometheus-window-words", at("tuning.prometheus", {"url": "http://p:9090",
                                                             "window": "forever"}), "window"),
    _adm("pool-selector-unknown", at("tuning.prometheus", {"url": "http://p:9090",
                                                           "poolSelector": "magic"}),
         "poolSelector"),
    _adm("drift-zero", at("tuning.retune", {"driftThreshold": 0}), "driftThreshold"),
    _adm("drift-two", at("tuning.retune", {"driftThreshold": 2}), "driftThreshold"),
    _adm("dwell-below-window", at("tuning", {"mode": "auto", "prometheus": {
        "url": "http://p:9090", "window": "1h"}, "retune": {"dwell": "5m"}}),
         "dwell must be at least"),
    _adm("canary-above-replicas", at("rollout", {"canaryReplicas": 3}), "canaryReplicas"),
    _adm("analysis-words", at("rollout", {"analysis": "soon"}), "rollout.analysis"),
    # --- issue 25: durations that make no sense, bounded in the CRD and pydantic alike ------
    _adm("progress-deadline-1ms", at("rollout", {"progressDeadline": "1ms"}),
         "rollout.progressDeadline must be between 1s and 24h"),
    _adm("progress-deadline-a-week", at("rollout", {"progressDeadline": "168h"}),
         "rollout.progressDeadline must be between 1s and 24h"),
    _adm("analysis-a-year", at("rollout", {"analysis": "8760h"}),
         "rollout.analysis must be between 1s and 24h"),
    _adm("prometheus-window-11000-years", at("tuning.prometheus", {
        "url": "http://p:9090", "window": "96360000h"}), "tuning.prometheus.window"),
    _adm("prometheus-window-1ms", at("tuning.prometheus", {"url": "http://p:9090",
                                                           "window": "1ms"}),
         "tuning.prometheus.window must be between 10s and 720h"),
    _adm("retune-min-interval-two-months", at("tuning.retune", {"minInterval": "1440h"}),
         "tuning.retune.minInterval must be between 0s and 720h"),
    _adm("calibration-timeout-1s", at("quality", {"calibration": {"timeout": "1s"}}),
         "quality.calibration.timeout must be between 1m and 24h"),
    _adm("scrape-interval-1ms", at("monitoring", {"scrape": {"interval": "1ms"}}),
         "monitoring.scrape.interval must be between 1s and 1h"),
    _adm("ttft-an-hour", at("slo", {"ttftP95": "1h"}), "slo.ttftP95 must be between 0s and 10m"),
    _adm("tpot-a-minute", at("slo", {"tpotP95": "1m"}), "slo.tpotP95 must be between 0s and 10s"),
    # --- issue 25: sizes ---------------------------------------------------------------------
    _adm("toleration-seconds-negative", at("pools.0.tolerations", [{
        "key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -5}]),
         "tolerationSeconds"),
    _adm("kv-cache-bytes-a-pebibyte", at("tuning.pin", {"kvCacheMemoryBytes": 2**50}),
         "kvCacheMemoryBytes"),
    _adm("runtime-secrets-bad-name", at("runtime", {"secrets": ["Bad_Name"]}),
         "spec.runtime.secrets[0]"),
    _adm("runtime-secrets-seventeen", at("runtime", {"secrets": [f"s{i}" for i in range(17)]}),
         "spec.runtime.secrets"),
    # --- issue 25: labels kvtune renders onto objects ----------------------------------------
    _adm("scrape-label-claims-kvtunes", at("monitoring", {"scrape": {"labels": {
        "kvtune.io/deployment": "someone-else"}}}), "kvtune's own"),
    _adm("rule-label-claims-managed-by", at("monitoring", {"prometheusRule": {"labels": {
        "app.kubernetes.io/managed-by": "me"}}}), "kvtune's own"),
    _adm("scrape-label-value-space", at("monitoring", {"scrape": {"labels": {
        "release": "kube prom"}}}), "monitoring.scrape.labels.release"),
    _adm("scrape-label-key-leading-dash", at("monitoring", {"scrape": {"labels": {
        "-team": "a"}}}), "not a label key"),
    _adm("rule-label-value-64", at("monitoring", {"prometheusRule": {"labels": {
        "release": "r" * 64}}}), "prometheusRule.labels.release"),
    _adm("node-selector-value-slash", at("pools.0.nodeSelector", {"zone": "eu/west"}),
         "nodeSelector.zone"),
    _adm("node-selector-key-space", at("pools.0.nodeSelector", {"my zone": "a"}),
         "not a label key"),
    # --- the object's own name -------------------------------------------------------------
    _adm("name-64-chars", _noop, "metadata.name must be at most 63", name="n" * 64),
    _adm("name-200-chars", _noop, "metadata.name must be at most 63", name="n" * 200),
    _adm("name-starts-with-digit", _noop, "metadata.name", name="1bot"),
    _adm("name-with-dot", _noop, "metadata.name", name="bot.v2"),
    # --- typo'd fields: pruned silently unless the client asks for strict validation ------
    BadSpec("typo-replica", at("pools.0.replica", 4), "strict", ("replica",)),
    BadSpec("typo-tunning", at("tunning", {"mode": "off"}), "strict", ("tunning",)),
    BadSpec("typo-max-num-seq", at("tuning.pin", {"maxNumSeq": 8}), "strict", ("maxNumSeq",)),
    BadSpec("typo-context", at("workload.contextToken", {"p50": 5}), "strict",
            ("contextToken",)),
    # issue 25: the p99 SLO a user believed in (kvtune has p95 targets only)
    BadSpec("slo-p99-pruned", at("slo", {"ttftP95": "2s", "ttftP99": "4s"}), "strict",
            ("ttftP99",)),
    BadSpec("typo-progress-deadline", at("rollout", {"progresDeadline": "10m"}), "strict",
            ("progresDeadline",)),
    # --- accepted, then Degraded with field, value and fix; the running runtime untouched -
    _deg("batched-tokens-one", at("tuning.pin", {"maxNumBatchedTokens": 1}), "InvalidSpec",
         "spec.tuning.pin.maxNumBatchedTokens=1", "pin at least"),
    _deg("max-model-len-below-p99", both(drop("workload.contextTokens"),
                                         at("tuning.pin", {"maxModelLen": 1})),
         "InvalidSpec", "spec.tuning.pin.maxModelLen=1", "p99", "raise it"),
    _deg("offload-64-tib", at("tuning.pin", {"kvOffloadingSizeGiB": 65536}), "InvalidSpec",
         "spec.tuning.pin.kvOffloadingSizeGiB=65536", "size it from the node's free memory"),
    _deg("absurd-slo", at("slo", {"ttftP95": "1ms", "tpotP95": "1ms"}), "NoFeasiblePlan",
         "spec.slo", "1ms", "relax the SLO"),
    _deg("contradictory-node-selector", at("pools.0.nodeSelector", {"zone": "nowhere"}),
         "InvalidSpec", "spec.pools[0].nodeSelector=zone=nowhere", "fix the selector"),
    _deg("unknown-model", at("model.name", "acme/not-a-real-model"), "UnknownModel",
         "spec.model.name", "acme/not-a-real-model", "configMapRef"),
    _deg("unknown-gpu-class", at("pools.0.gpuClass", "Z999"), "InvalidSpec",
         "spec.pools[0].gpuClass", "Z999"),
    _deg("model-does-not-fit", both(at("model.name", "meta-llama/Llama-3.3-70B-Instruct"),
                                    at("pools.0.tensorParallel", 1)), "NoFeasiblePlan",
         "spec.pools[0]", "tensorParallel=1"),
    _deg("mla-dtype-on-gqa", at("tuning.pin", {"kvCacheDtype": "fp8_ds_mla"}), "InvalidSpec",
         "spec.tuning.pin.kvCacheDtype", "fp8_ds_mla"),
    _deg("model-config-missing", at("model", {"name": "acme/custom-7b", "config": {
        "configMapRef": {"name": "no-such-config"}}}), "InvalidSpec",
         "spec.model.config.configMapRef", "no-such-config", "not found"),
    _deg("model-config-not-json", at("model", {"name": "acme/custom-7b", "config": {
        "configMapRef": {"name": "not-json"}}}), "InvalidSpec", "not JSON", "config.json",
         config_maps={"not-json": {"config.json": "{{{"}}),
    _deg("pod-template-missing", at("runtime.podTemplate", {"configMapRef": {
        "name": "no-such-template"}}), "InvalidPodTemplate", "no-such-template", "not found"),
    _deg("pod-template-divides-by-zero", at("runtime.podTemplate", {"configMapRef": {
        "name": "zero-div"}}), "InvalidPodTemplate", "pool h100", "nothing was changed",
         config_maps={"zero-div": {"pod.yaml.j2": TEMPLATE_DIVIDES_BY_ZERO}}),
    _deg("pod-template-not-a-pod", at("runtime.podTemplate", {"configMapRef": {
        "name": "not-a-pod"}}), "InvalidPodTemplate", "pool h100", "nothing was changed",
         config_maps={"not-a-pod": {"pod.yaml.j2": TEMPLATE_NOT_A_POD}}),
    # --- issue 25: capacity that can never be met; what a tenant's template may not reach --
    _deg("replicas-beyond-the-nodes", at("pools.0.replicas", 512), "InvalidSpec",
         "spec.pools[0].replicas=512", "need 512 H100 GPUs", "have 32 in all",
         "lower replicas to at most 32"),
    _deg("replicas-tp-beyond-the-nodes", both(at("pools.0.replicas", 20),
                                              at("pools.0.tensorParallel", 2)),
         "InvalidSpec", "spec.pools[0].replicas=20", "tensorParallel=2", "need 40 H100 GPUs",
         "room for 16"),
    _deg("template-own-image", at("runtime.podTemplate", {"configMapRef": {
        "name": "own-image"}}), "InvalidSpec", "image='evil.example/miner:1'",
         "podPolicy.allowedImages", config_maps={"own-image": {"pod.yaml.j2": TEMPLATE_IMAGE}}),
    _deg("template-secret-not-named", at("runtime.podTemplate", {"configMapRef": {
        "name": "mounts-db"}}), "InvalidPodTemplate", "secret='db'",
         "podPolicy.allowedSecrets", config_maps={"mounts-db": {"pod.yaml.j2": TEMPLATE_SECRET}}),
    _deg("template-claims-kvtunes-label", at("runtime.podTemplate", {"configMapRef": {
        "name": "claims-label"}}), "InvalidPodTemplate",
         "metadata.labels['kvtune.io/deployment']='someone-else' overrides kvtune's own",
         config_maps={"claims-label": {"pod.yaml.j2": TEMPLATE_LABEL}}),
    _deg("template-label-value-refused", at("runtime.podTemplate", {"configMapRef": {
        "name": "bad-label"}}), "InvalidPodTemplate",
         "metadata.labels['team']='a b': not a label value", "fix the template",
         config_maps={"bad-label": {"pod.yaml.j2": TEMPLATE_BAD_LABEL}}),
    # --- issue 26: prefill/decode pools ----------------------------------------------------
    _adm("decode-without-its-prefill-pool", at("pools.0.role", "decode"),
         "role: decode needs pools[].prefillPool"),
    _adm("prefill-pool-on-a-colocated-pool", at("pools.0.prefillPool", "h100"),
         "prefillPool is for a pool with role: decode"),
    _adm("role-pin-without-a-role", at("pools.0.pin", {"blockSize": 32}),
         "pools[].pin holds one role's own pins"),
    _adm("role-with-tp-auto", at("pools", [_PREFILL | {"tensorParallel": "auto"}, _DECODE]),
         "a pool with a role needs a pinned tensorParallel"),
    _adm("decode-names-a-missing-pool", at("pools", [_PREFILL, _DECODE | {
        "prefillPool": "nope"}]), "must name a pool of this spec with role: prefill"),
    _adm("prefill-pool-with-no-decode", at("pools", [_PREFILL]),
         "must be named by the prefillPool of exactly one decode pool"),
    # --- issue 26: the layout chosen over gpusPerReplica GPUs --------------------------------
    _adm("gpus-per-replica-beside-a-pinned-tp", at("pools", [{
        "gpuClass": "H100", "name": "h100", "gpusPerReplica": 8, "tensorParallel": 2}]),
         "pools[].gpusPerReplica has kvtune choose the whole layout",
         "drop tensorParallel, dataParallel and expertParallel"),
    _adm("gpus-per-replica-split-unevenly-over-nodes", at("pools", [{
        "gpuClass": "H100", "name": "h100", "gpusPerReplica": 9, "nodesPerReplica": 2}]),
         "pools[].gpusPerReplica must be a multiple of nodesPerReplica"),
    _adm("gpus-per-replica-on-a-role", at("pools", [_PREFILL | {"gpusPerReplica": 2},
                                                    _DECODE]),
         "drop gpusPerReplica from it"),
    # --- issue 26: pinned pipeline stages --------------------------------------------------
    _adm("pipeline-parallel-over-nodes-with-data-parallel", at("pools", [{
        "gpuClass": "H100", "name": "h100", "tensorParallel": 8, "pipelineParallel": 2,
        "dataParallel": 2, "nodesPerReplica": 2}]),
         "pools[].pipelineParallel over nodesPerReplica nodes runs one engine per replica",
         "drop dataParallel from the pool"),
    # 3 stages over 2 nodes: vLLM would put half of stage 1's TP ranks on each node.
    _adm("pipeline-stages-split-over-nodes", at("pools", [{
        "gpuClass": "H100", "name": "h100", "tensorParallel": 4, "pipelineParallel": 3,
        "nodesPerReplica": 2}]),
         "pools[].pipelineParallel must be a multiple of nodesPerReplica",
         "raise pipelineParallel or lower nodesPerReplica"),
    _adm("pipeline-parallel-beside-gpus-per-replica", at("pools", [{
        "gpuClass": "H100", "name": "h100", "gpusPerReplica": 8, "pipelineParallel": 2}]),
         "pools[].pipelineParallel runs at a pinned layout, without a role"),
    _adm("pipeline-parallel-at-tp-auto", at("pools", [{
        "gpuClass": "H100", "name": "h100", "tensorParallel": "auto", "pipelineParallel": 2}]),
         "pools[].pipelineParallel needs a pinned tensorParallel"),
    # --- issue 26: decode context parallel, pinned (as `kvtune plan --dcp`) -----------------
    _adm("dcp-not-dividing-the-tp", at("pools", [{
        "gpuClass": "H100", "name": "h100", "tensorParallel": 2, "decodeContextParallel": 4}]),
         "pools[].decodeContextParallel must divide a pinned tensorParallel"),
    _adm("dcp-at-tp-auto", at("pools", [{
        "gpuClass": "H100", "name": "h100", "tensorParallel": "auto",
        "decodeContextParallel": 2}]),
         "pools[].decodeContextParallel must divide a pinned tensorParallel"),
    _adm("dcp-not-dividing-gpus-per-replica", at("pools", [{
        "gpuClass": "H100", "name": "h100", "gpusPerReplica": 8, "decodeContextParallel": 3}]),
         "pools[].decodeContextParallel must divide gpusPerReplica"),
    _adm("dcp-on-a-role", at("pools", [_PREFILL | {"tensorParallel": 2,
                                                   "decodeContextParallel": 2}, _DECODE]),
         "drop decodeContextParallel from it"),
    _adm("dcp-zero", at("pools", [{"gpuClass": "H100", "name": "h100",
                                   "decodeContextParallel": 0}]),
         "decodeContextParallel", "greater than or equal to 1"),
    # The planner's check: kvtune plans DCP for MLA models only (one line, the field named).
    _deg("dcp-on-a-model-without-mla", at("pools.0", {
        "gpuClass": "H100", "name": "h100", "replicas": 1, "tensorParallel": 2,
        "decodeContextParallel": 2}), "InvalidSpec",
         "spec.pools[0]", "pools[].decodeContextParallel=2", "drop decodeContextParallel"),
    # The pool already running stays first (a spec without it would prune its Deployment).
    _deg("pair-block-sizes-the-handshake-refuses", at("pools", [
        *BASE["pools"], _PREFILL | {"pin": {"blockSize": 32}},
        _DECODE | {"pin": {"blockSize": 16}}]),
         "KVTransferIncompatible", "spec.pools[1] (prefill pool pre, pair pre/dec)",
         "blockSize='prefill 32, decode 16'", "NixlConnector",
         "pin pools[].pin.blockSize 32 on both roles"),
    # --- accepted at the edge of a bound, and applied as written ---------------------------
    BadSpec("replicas-exactly-the-nodes", at("pools.0.replicas", 32), "accepted", (),
            deployment={"replicas": 32}),
    BadSpec("progress-deadline-a-day", at("rollout", {"progressDeadline": "24h"}),
            "accepted", (), deployment={"progressDeadlineSeconds": 86400}),
    BadSpec("progress-deadline-one-second", at("rollout", {"progressDeadline": "1s"}),
            "accepted", (), deployment={"progressDeadlineSeconds": 1}),
]
