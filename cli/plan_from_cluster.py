"""``kvtune plan --from-cluster NAME -o patch``: the Git change that pins a recommended plan.

In ``recommend`` mode the operator writes each pool's plan to the InferenceDeployment's
status and deploys nothing. A reviewer who agrees commits the plan into ``spec.tuning.pin``
(Argo CD owns the spec, so the change goes through Git, not ``kubectl edit``). This prints
that change as a patch of the InferenceDeployment: ``apiVersion``/``kind``/``metadata``
plus ``spec.tuning.pin``, usable as a kustomize patch or with
``kubectl patch --type merge --patch-file``, with the plan's reasons as comments.

``spec.tuning.pin`` is one set of knobs for every pool, while plans are per GPU class: a
knob whose value differs between pools is left to the tuner (listed in the comments) unless
``pool`` picks one pool's plan.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvtune.tuner.knobs import PINNABLE, camel_name

GROUP, VERSION, PLURAL = "kvtune.io", "v1alpha1", "inferencedeployments"

# Status plan key -> spec.tuning.pin key: the pinnable knobs, camelCase in both.
_PIN_KEYS = {camel_name(k): camel_name(k) for k in PINNABLE}


class NoRecommendation(Exception):
    """The object has no plan to pin yet; the message says why and what to do."""


def _planned_pools(obj: dict[str, Any], pool: str | None) -> list[dict[str, Any]]:
    meta = obj.get("metadata", {})
    where = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
    pools = [p for p in (obj.get("status") or {}).get("pools") or [] if p.get("plan")]
    if not pools:
        raise NoRecommendation(
            f"InferenceDeployment {where} has no plan in status.pools yet: expected the "
            "operator to have planned at least one pool. Check `kubectl describe "
            f"inferencedeployment -n {meta.get('namespace')} {meta.get('name')}` (conditions) "
            "and that the operator runs.")
    if pool is None:
        return pools
    chosen = [p for p in pools if pool in (p.get("name"), str(p.get("gpuClass", "")).lower(),
                                             p.get("gpuClass"))]
    if not chosen:
        names = ", ".join(f"{p.get('name')} ({p.get('gpuClass')})" for p in pools)
        raise NoRecommendation(f"no planned pool {pool!r} in {where}; planned pools: {names}")
    return chosen


def pin_patch(obj: dict[str, Any], pool: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The patch pinning the plan(s) in ``obj``'s status, and the comment lines explaining it."""
    pools = _planned_pools(obj, pool)
    meta = obj["metadata"]
    status = obj.get("status") or {}
    pin: dict[str, Any] = {}
    differing: list[str] = []
    for plan_key, pin_key in _PIN_KEYS.items():
        values = [p["plan"].get(plan_key) for p in pools]
        if all(v is None for v in values):
            continue
        if all(v == values[0] for v in values):
            pin[pin_key] = values[0]
        else:
            per_pool = ", ".join(f"{p.get('name')}={v}" for p, v in zip(pools, values, strict=True))
            differing.append(f"{pin_key} differs by pool ({per_pool}): left to the tuner")
    # vLLM ignores the fraction when the bytes are set; the pin accepts only one of them.
    if "kvCacheMemoryBytes" in pin:
        pin.pop("gpuMemoryUtilization", None)

    comments = [
        f"kvtune: pin the plan recommended for {meta.get('namespace')}/{meta['name']}",
    ]
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        comments.append(f"WARNING: status is for generation {observed}, the spec is at "
                        f"{generation}; the operator has not planned the latest spec yet")
    profile = status.get("profile") or {}
    if profile:
        figures = ", ".join(f"{k} {profile[k]}" for k in ("source", "window", "requests")
                            if profile.get(k) is not None)
        comments.append(f"profile: {figures}")
    for p in pools:
        expected = p.get("expected") or {}
        comments.append(
            f"pool {p.get('name')} ({p.get('gpuClass')} x TP{p.get('tensorParallel')}): "
            f"expects {expected.get('kvCacheTokens', '?')} KV tokens, "
            f"{expected.get('concurrentSequences', '?')} sequences at "
            f"{expected.get('concurrentSequencesContextTokens', '?')} tokens")
        comments += [f"  {reason}" for reason in p.get("reasons") or []]
    comments += differing
    mode = ((obj.get("spec") or {}).get("tuning") or {}).get("mode", "auto")
    if mode == "recommend":
        comments.append("spec.tuning.mode stays recommend: set it to auto to roll this plan out")
    patch = {
        "apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"),
        "kind": obj.get("kind", "InferenceDeployment"),
        "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
        "spec": {"tuning": {"pin": pin}},
    }
    return patch, comments


def render_patch(obj: dict[str, Any], pool: str | None = None) -> str:
    patch, comments = pin_patch(obj, pool)
    header = "".join(f"# {line}\n" for line in comments)
    return header + yaml.safe_dump(patch, sort_keys=False)


def fetch(name: str, namespace: str, kubeconfig: str | None = None,
          context: str | None = None) -> dict[str, Any]:
    """The InferenceDeployment as the API server has it (kubeconfig, else in-cluster)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kvtune.cli.kube_access import ClusterUnreachable, api_client, check_api_server

    try:
        kube = api_client(kubeconfig, context)
        check_api_server(kube, kubeconfig)
    except ClusterUnreachable as exc:
        raise NoRecommendation(f"--from-cluster {name}: {exc}") from exc
    api = client.CustomObjectsApi(kube)
    try:
        got: Any = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        obj: dict[str, Any] = got
    except ApiException as err:
        if err.status == 404:
            raise NoRecommendation(
                f"InferenceDeployment {namespace}/{name} not found (expected it in namespace "
                f"{namespace!r}; pass -n NAMESPACE)") from err
        raise NoRecommendation(
            f"--from-cluster {name}: the API server refused to read {namespace}/{name} "
            f"({err.status} {err.reason}); check the kubeconfig's permissions") from err
    return obj


FROM_CLUSTER_OPTIONS = ("from_cluster", "namespace", "pool", "kubeconfig")


def handle_plan_options(opts: dict[str, Any]) -> bool:
    """The ``--from-cluster`` branch of ``kvtune plan``: pops its options from ``opts``;
    True when it ran (the offline planner must not), False to let ``kvtune plan`` go on."""
    import click

    name, namespace, pool, kubeconfig = (opts.pop(k, None) for k in FROM_CLUSTER_OPTIONS)
    output = opts.get("output")
    if name is None:
        if output == "patch":
            raise click.UsageError("-o patch needs --from-cluster NAME (the InferenceDeployment "
                                   "whose recommended plan to pin)")
        return False
    if output != "patch":
        raise click.UsageError(f"--from-cluster prints a patch: use -o patch, not -o {output}")
    try:
        obj = fetch(name, namespace or "default", kubeconfig=kubeconfig)
        click.echo(render_patch(obj, pool), nl=False)
    except NoRecommendation as exc:
        # Bad input or an unreachable cluster: exit 1 (usage errors exit 2).
        raise click.ClickException(str(exc)) from None
    return True
