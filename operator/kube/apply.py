"""Talking to the API server: server-side apply of the rendered children, reads, status.

Every write goes through server-side apply under one field manager (``kvtune``), so applying
the same objects again is a no-op on the server (no new Deployment generation, no rollout)
and a restarted operator converges without churn. A pool's objects go all or nothing: if the
API server refuses any of them (a user's pod template that renders an invalid object, a quota
on Services), nothing of that pool is changed. Every object is first applied with
``dryRun=All``, except a Service that does not exist yet: its dry run allocates a ClusterIP
like the real create (about 0.4 s of API-server time each, the largest cost of a new pool), so
the new Services are created for real first, before anything else is written, and one refused
deletes again the Services this apply created (``apply_pool``).

Never a confused deputy: an object is applied (with ``force``, taking back fields another
manager changed) only when it does not exist yet or its controller owner reference is this
InferenceDeployment's UID and its kvtune labels name the same pool. Anything else with the
same name (a Service, Role, RoleBinding someone else made, another InferenceDeployment's or
another pool's object) raises ``NameCollision``: it is left alone, never adopted, never given
an owner reference (so deleting the InferenceDeployment never garbage-collects it), never
deleted by a prune or a canary clean-up.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlencode

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kvtune.operator import api
from kvtune.operator.api.names import FIELD_MANAGER, LABEL_DEPLOYMENT, LABEL_POOL
from kvtune.operator.kube import events
from kvtune.operator.prometheus import monitors
from kvtune.operator.render import leader_worker_set as lws
from kvtune.operator.routing import endpoint_picker

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# Connections kept open to the API server. The client's default (5 per core) is fewer than
# the operator's threads (kopf's handler threads, the periodic workers, the GPU-inventory
# thread): a connection given back to a full pool is closed, and the next call pays a new
# TLS handshake (a tenth of the operator's CPU at 200 objects, and as much on the server).
CONNECTIONS = 32


class ApplyError(Exception):
    """The API server refused an object; the message quotes its kind, name and reason."""


class Forbidden(ApplyError):
    """The operator's account may not read or write that object there (403): the chart did
    not grant it in that namespace."""


class NameCollision(ApplyError):
    """An object of that kind and name exists and kvtune did not create it for this
    InferenceDeployment (and pool); the message says whose it is and the fix."""


# Where each kind kvtune reads or writes is served: (API path prefix, plural). The one
# source of the paths the operator calls (docs/rbac.md lists the verbs).
RESOURCES: dict[str, tuple[str, str]] = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    # spec.pools[].nodesPerReplica > 1 (operator/render/leader_worker_set.py)
    lws.KIND: (f"/apis/{lws.API_VERSION}", "leaderworkersets"),
    "Service": ("/api/v1", "services"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    # spec.runtime.entrypoint: kvtune (operator/render/runtime_access.py)
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    # spec.routing (operator/routing/inference_pool.py): the endpoint picker's configuration and
    # pool;
    # the calibration report (operator/calibration/calibration_flow.py); the runtime's reports
    "ConfigMap": ("/api/v1", "configmaps"),
    # spec.quality.calibration (operator/calibration/calibration_flow.py)
    "Job": ("/apis/batch/v1", "jobs"),
    # The Gateway API Inference Extension's InferencePool and Gateway API's HTTPRoute
    # (spec.routing.gateway, operator/routing/http_route.py).
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    # spec.monitoring (operator/monitoring/alert_rules.py): the Prometheus operator's kinds
    **{kind: (f"/apis/{monitors.GROUP}/{monitors.VERSION}", plural)
       for kind, plural in monitors.PLURALS.items()},
    # Read only, or created only
    "Pod": ("/api/v1", "pods"),
    "Node": ("/api/v1", "nodes"),
    "Event": ("/api/v1", "events"),
    api.KIND: (f"/apis/{api.GROUP}/{api.VERSION}", api.PLURAL),
}
# The kinds kvtune applies as a pool's (or an InferenceDeployment's) children.
APPLIED_KINDS = ("Deployment", lws.KIND, "Service", "PodDisruptionBudget", "ServiceAccount",
                 "Role", "RoleBinding", "ConfigMap", "Job", "InferencePool", "HTTPRoute")


def path(kind: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:
    """The API path of ``kind`` (a collection without ``name``; cluster-wide without
    ``namespace``)."""
    prefix, plural = RESOURCES[kind]
    where = f"{prefix}/namespaces/{quote(namespace, safe='')}" if namespace else prefix
    out = f"{where}/{plural}"
    if name is not None:
        out += f"/{quote(name, safe='')}"
    if subresource is not None:
        out += f"/{subresource}"
    return out


@dataclass
class Kube:
    """The operator's connection to the API server (see docs/rbac.md for the verbs).

    The operator calls the REST API through ``request`` (plain JSON in and out), not through
    the kubernetes client's typed API classes: importing those builds a pydantic model for
    every Kubernetes kind (about 90 MB resident, a third of the operator's memory at 1,000
    objects) and validates every call's arguments, for no use here. The typed groups
    (``core``, ``apps``, …) stay for the tests and the CLI."""

    api_client: client.ApiClient

    def request(self, method: str, api_path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        """One call; the reply's JSON. A reply outside 2xx raises the client's
        ``ApiException`` (``status``, ``reason``, ``body``), as its typed calls do."""
        if query:
            api_path += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v
                                         for k, v in query.items()})
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        # param_serialize adds the default headers and the credentials (a service account's
        # token is re-read when it rotates); the body goes as is (it is plain JSON already).
        method, url, headers, _, _ = self.api_client.param_serialize(
            method, api_path, header_params=headers, auth_settings=["BearerToken"])
        response = self.api_client.call_api(method, url, headers, body)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        data: dict[str, Any] = json.loads(response.data or b"{}")
        return data

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> Kube:
        cfg = client.Configuration()
        if kubeconfig:
            # kubernetes' config loaders carry no annotations.
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg)
        cfg.connection_pool_maxsize = CONNECTIONS
        return cls(client.ApiClient(cfg))

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api_client)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api_client)

    @property
    def policy(self) -> client.PolicyV1Api:
        return client.PolicyV1Api(self.api_client)

    @property
    def rbac(self) -> client.RbacAuthorizationV1Api:
        return client.RbacAuthorizationV1Api(self.api_client)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)


def _json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data or b"{}")
    return data


def _reason(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)


def list_nodes(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.request("GET", path("Node"))["items"]
    return items


def read_config_map_key(kube: Kube, namespace: str, name: str, key: str, *, field: str) -> str:
    """The text under ``key`` of a ConfigMap; errors name the spec field that pointed there."""
    return config_map_key(read_config_map_data(kube, namespace, name, field=field),
                          namespace, name, key, field=field)


def config_map_key(data: Mapping[str, str], namespace: str, name: str, key: str, *,
                   field: str) -> str:
    """``data[key]`` of a ConfigMap read by ``read_config_map_data``, or a one-line error."""
    if key not in data:
        raise LookupError(f"{field}: ConfigMap {namespace}/{name} has no key {key!r} "
                          f"(keys: {sorted(data)}); set configMapRef.key")
    return str(data[key])


def read_config_map_data(kube: Kube, namespace: str, name: str, *, field: str
                         ) -> dict[str, str]:
    """Every key of a ConfigMap's data; errors name the spec field that pointed there."""
    try:
        cm = kube.request("GET", path("ConfigMap", namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            raise LookupError(f"{field}: ConfigMap {namespace}/{name} not found; create it or "
                              f"fix the name") from exc
        raise
    data = cm.get("data") or {}
    return {str(k): str(v) for k, v in data.items()}


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _kind_path(kind: str, namespace: str, name: str) -> str:
    if kind not in APPLIED_KINDS:
        raise ApplyError(f"kvtune does not apply objects of kind {kind!r}")
    return path(kind, namespace, name)


def read_object(kube: Kube, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as the server holds it; None when there is none."""
    try:
        return kube.request("GET", _kind_path(kind, namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        error = Forbidden if exc.status == 403 else ApplyError
        raise error(f"{kind} {namespace}/{name}: kvtune cannot read it to check who owns "
                    f"it ({_reason(exc)}); grant the operator `get` on it") from exc


# Labels that tell one pool's objects (and a canary) from another's of the same object.
_IDENTITY_LABELS = (LABEL_DEPLOYMENT, LABEL_POOL, "kvtune.io/track")


def foreign_owner(existing: Mapping[str, Any], owner: Mapping[str, Any],
                  labels: Mapping[str, str] | None = None) -> str | None:
    """None when ``existing`` is kvtune's object for ``owner`` (its controller reference is
    the owner's UID and, given ``labels``, the pool labels agree); else whose it is."""
    meta = existing.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    uid = owner["metadata"].get("uid")
    if controller is not None and controller.get("uid") == uid:
        theirs = meta.get("labels") or {}
        ours = labels or {}
        for key in _IDENTITY_LABELS:
            if key in ours and theirs.get(key) != ours.get(key):
                return (f"it belongs to {key}={theirs.get(key) or '(none)'}, not "
                        f"{ours.get(key)}")
        return None
    if controller is not None:
        return f"it is controlled by {controller.get('kind')} {controller.get('name')}"
    managers = sorted({m.get("manager", "?") for m in meta.get("managedFields") or []})
    return f"it is managed by {', '.join(managers) or 'someone else'}"


def check_ours(kube: Kube, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """Raise ``NameCollision`` unless ``obj`` is absent (False) or kvtune's for ``owner``
    (True)."""
    meta = obj["metadata"]
    existing = read_object(kube, obj["kind"], meta["namespace"], meta["name"])
    if existing is None:
        return False
    whose = foreign_owner(existing, owner, meta.get("labels"))
    if whose is not None:
        raise NameCollision(
            f"{obj['kind']} {meta['namespace']}/{meta['name']} already exists and kvtune did "
            f"not create it for InferenceDeployment {owner['metadata']['name']} ({whose}); "
            f"kvtune leaves it alone: rename the InferenceDeployment or the pool "
            f"(spec.pools[].name), or remove that {obj['kind']} if it is a leftover")
    return True


def apply_object(kube: Kube, obj: dict[str, Any], *, dry_run: bool = False,
                 force: bool = True) -> dict[str, Any]:
    """Server-side apply as kvtune. ``force`` takes back fields another manager set: only
    for an object that is kvtune's own (``check_ours``)."""
    meta = obj["metadata"]
    query: dict[str, Any] = {"fieldManager": FIELD_MANAGER, "force": force}
    if dry_run:
        query["dryRun"] = "All"
    try:
        return kube.request("PATCH", _kind_path(obj["kind"], meta["namespace"], meta["name"]),
                            query=query, body=obj, content_type=APPLY_CONTENT_TYPE)
    except ApiException as exc:
        if exc.status == 404 and obj["kind"] == lws.KIND:  # no LWS CRD on this cluster
            raise ApplyError(f"{lws.KIND} {meta['namespace']}/{meta['name']}: the API server "
                             f"does not serve {lws.API_VERSION} {lws.KIND}s; install "
                             f"LeaderWorkerSet {lws.LWS_VERSION} ({lws.LWS_MODULE}: its CRD "
                             f"and controller), or set spec.pools[].nodesPerReplica: 1"
                             ) from exc
        if exc.status == 409 and not force:
            raise NameCollision(
                f"{obj['kind']} {meta['namespace']}/{meta['name']} appeared meanwhile with "
                f"fields another manager owns ({_reason(exc)}); kvtune leaves it alone") from exc
        error = Forbidden if exc.status == 403 else ApplyError
        raise error(f"{obj['kind']} {meta['namespace']}/{meta['name']} was refused by the "
                    f"API server: {_reason(exc)}") from exc


def apply_pool(
    kube: Kube, objects: list[dict[str, Any]], owner: Mapping[str, Any], *,
    absent: Collection[tuple[str, str]] = (),
) -> list[dict[str, Any]]:
    """Apply a pool's objects all or nothing; returns what the server holds, in the order of
    ``objects``.

    ``absent``: the (kind, name) of objects a read earlier in this reconcile found absent,
    not read again. Like any absent object, such an object is applied without ``force``: one
    that appeared since is refused (409, ``NameCollision``), never taken over.

    Every object must be absent or kvtune's own (``check_ours``). Each is dry-run, except a
    Service that does not exist yet (its dry run allocates a ClusterIP as the create does);
    then those new Services are created for real, before anything else is written, and only
    then is the rest applied. A new Service refused deletes the Services created before it
    here (they are kvtune's, just made: an owner reference to ``owner``, no other writer
    yet), so a refused pool still changes nothing."""
    owned = []
    for obj in objects:
        obj = dict(obj)
        obj["metadata"] = {**obj["metadata"], "ownerReferences": [owner_reference(owner)]}
        known_absent = (obj["kind"], obj["metadata"]["name"]) in absent
        owned.append((obj, False if known_absent else check_ours(kube, obj, owner)))
    first = [i for i, (obj, ours) in enumerate(owned) if obj["kind"] == "Service" and not ours]
    for i, (obj, ours) in enumerate(owned):
        if i not in first:
            apply_object(kube, obj, dry_run=True, force=ours)
    held: dict[int, dict[str, Any]] = {}
    for i in first:
        try:
            held[i] = apply_object(kube, owned[i][0], force=False)
        except ApplyError as exc:
            _delete_created(kube, list(held.values()), exc)
            raise
    return [held[i] if i in held else apply_object(kube, obj, force=ours)
            for i, (obj, ours) in enumerate(owned)]


def _delete_created(kube: Kube, created: list[dict[str, Any]], refused: ApplyError) -> None:
    """Delete objects this apply has just created (conditional on their UID, so an object
    that replaced one meanwhile is left alone); one already gone is fine."""
    for obj in created:
        meta = obj["metadata"]
        try:
            kube.request("DELETE", path(obj["kind"], meta["namespace"], meta["name"]),
                         body={"preconditions": {"uid": meta["uid"]}})
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise ApplyError(f"{refused}; the {obj['kind']} {meta['namespace']}/"
                                 f"{meta['name']} created just before could not be deleted "
                                 f"again ({_reason(exc)}): delete it") from exc


def apply_owned(kube: Kube, obj: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """One object that no other object's admission depends on: ``check_ours``, then apply
    (no dry run: there is nothing to keep all-or-nothing with)."""
    obj = {**obj, "metadata": {**obj["metadata"], "ownerReferences": [owner_reference(owner)]}}
    return apply_object(kube, obj, force=check_ours(kube, obj, owner))


def apply_each(
    kube: Kube, objects: list[dict[str, Any]], owner: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Dry-run and apply one object at a time, in order, for objects whose admission needs an
    earlier one to exist: a RoleBinding's escalation check resolves its Role, so its dry run
    fails while the Role is only dry-run too (unless the caller may ``bind``)."""
    return [apply_pool(kube, [obj], owner)[0] for obj in objects]


def read_deployment(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", path("Deployment", namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def rollout_done(deployment: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a Deployment runs its current template on every replica, and what is left."""
    meta, spec = deployment.get("metadata", {}), deployment.get("spec", {})
    status = deployment.get("status") or {}
    want = int(spec.get("replicas", 1))
    if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 0)):
        return False, "the Deployment controller has not seen the new template yet"
    updated = int(status.get("updatedReplicas", 0))
    available = int(status.get("availableReplicas", 0))
    total = int(status.get("replicas", 0))
    if updated < want:
        return False, f"{updated}/{want} replicas updated"
    if total > updated:
        return False, f"{total - updated} old replicas pending termination"
    if available < want:
        return False, f"{available}/{want} replicas available"
    return True, f"{want}/{want} replicas updated and available"


def list_pods(kube: Kube, namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """The pods matching ``label_selector`` (the runtime reports are in their annotations)."""
    items: list[dict[str, Any]] = kube.request(
        "GET", path("Pod", namespace), query={"labelSelector": label_selector}).get("items", [])
    return items


def delete_deployment(kube: Kube, namespace: str, name: str,
                      owner: Mapping[str, Any]) -> bool:
    """Delete kvtune's Deployment of ``owner`` (and, in the background, its pods); False when
    it was not there. Someone else's Deployment of that name is left alone
    (``NameCollision``); the delete is conditional on the UID checked."""
    existing = read_deployment(kube, namespace, name)
    if existing is None:
        return False
    whose = foreign_owner(existing, owner)
    if whose is not None:
        raise NameCollision(f"Deployment {namespace}/{name} was not deleted: kvtune did not "
                            f"create it for InferenceDeployment {owner['metadata']['name']} "
                            f"({whose})")
    try:
        kube.request("DELETE", path("Deployment", namespace, name), body={
            "propagationPolicy": "Background",
            "preconditions": {"uid": existing["metadata"]["uid"]}})
    except ApiException as exc:
        if exc.status in (404, 409):  # gone meanwhile, or replaced by another object
            return False
        raise
    return True


def rollout_stuck(deployment: Mapping[str, Any]) -> str | None:
    """The Deployment controller's message when the rollout passed its progress deadline."""
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("status") == "False" \
                and condition.get("reason") == "ProgressDeadlineExceeded":
            return str(condition.get("message") or "progress deadline exceeded")
    return None


def prune_pools(kube: Kube, owner: Mapping[str, Any], keep: set[str]) -> list[str]:
    """Delete the children of pools no longer in the spec; returns the deleted names. Only
    kvtune's own objects of ``owner`` (controller reference to its UID) are deleted, whatever
    labels anything else carries."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    selector = f"{LABEL_DEPLOYMENT}={name}"
    deleted: list[str] = []
    for kind in ("Deployment", lws.KIND, "Service", "PodDisruptionBudget"):
        try:
            items = kube.request("GET", path(kind, namespace),
                                 query={"labelSelector": selector})
        except ApiException as exc:
            if exc.status == 404 and kind == lws.KIND:  # no LWS CRD: no LWS to prune
                continue
            raise
        deleted += _delete_ours(kube, owner, [
            item for item in items.get("items", [])
            if (item["metadata"].get("labels") or {}).get(LABEL_POOL) not in keep], kind)
    return deleted


def _delete_ours(kube: Kube, owner: Mapping[str, Any], items: list[dict[str, Any]],
                 kind: str) -> list[str]:
    deleted = []
    namespace = owner["metadata"]["namespace"]
    for item in items:
        if foreign_owner(item, owner) is None:
            try:
                kube.request("DELETE", path(kind, namespace, item["metadata"]["name"]))
                deleted.append(f"{kind}/{item['metadata']['name']}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
    return deleted


def prune_routing(kube: Kube, owner: Mapping[str, Any], *, routing: bool, route: bool,
                  keep: set[str]) -> list[str]:
    """Delete kvtune's routing objects of ``owner`` that its spec no longer asks for; returns
    the deleted names. Without ``routing``: the endpoint pickers' Deployments and Services
    (they run, and cost a pod each), the InferencePools and the HTTPRoute; without ``route``:
    the HTTPRoute; the InferencePools of pools not in ``keep``. The pickers' ConfigMaps are
    inert and stay until the InferenceDeployment goes (owner reference). Only kvtune's own
    objects of ``owner``; needs the chart's routing rights (routing.enabled)."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    deleted: list[str] = []
    if not routing:
        selector = f"{LABEL_DEPLOYMENT}={name},{endpoint_picker.LABEL_PICKER}"
        for kind in ("Deployment", "Service"):
            items = kube.request("GET", path(kind, namespace),
                                 query={"labelSelector": selector})
            deleted += _delete_ours(kube, owner, items.get("items", []), kind)
    pools = kube.request("GET", path("InferencePool", namespace),
                         query={"labelSelector": f"{LABEL_DEPLOYMENT}={name}"})
    stale = [p for p in pools.get("items", [])
             if not routing or (p["metadata"].get("labels") or {}).get(LABEL_POOL) not in keep]
    deleted += _delete_ours(kube, owner, stale, "InferencePool")
    if not route:
        existing = read_object(kube, "HTTPRoute", namespace, name)
        if existing is not None:
            deleted += _delete_ours(kube, owner, [existing], "HTTPRoute")
    return deleted


PatchOutcome = Literal["written", "conflict", "gone"]


def patch_status(kube: Kube, namespace: str, name: str, status: dict[str, Any],
                 *, resource_version: str) -> PatchOutcome:
    """A JSON merge patch of the status subresource (lists are replaced whole) that applies
    only if nobody wrote the object since ``resource_version`` (optimistic concurrency:
    ``conflict`` when somebody did, ``gone`` when the object was deleted meanwhile).
    ``operator/kube/status.py`` is its one caller: it reads again and retries on a conflict."""
    body: dict[str, Any] = {"status": status, "metadata": {"resourceVersion": resource_version}}
    try:
        kube.request("PATCH", path(api.KIND, namespace, name, "status"), body=body,
                     content_type="application/merge-patch+json")
    except ApiException as exc:
        if exc.status == 404:
            return "gone"
        if exc.status == 409:
            return "conflict"
        raise
    return "written"


def post_event(kube: Kube, owner: Mapping[str, Any], type_: str, reason: str,
               message: str) -> None:
    """A core/v1 Event on the InferenceDeployment (what `kubectl describe` shows), one per
    change of reason: repeats are folded into the last Event (``operator/kube/events.py``)."""
    events.RECORDER.post(kube.request, owner, type_, reason, message)


def list_inference_deployments(kube: Kube, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every InferenceDeployment in ``namespaces`` (all namespaces when empty)."""
    if not namespaces:
        return list(kube.request("GET", path(api.KIND)).get("items", []))
    items: list[dict[str, Any]] = []
    for namespace in namespaces:
        items += kube.request("GET", path(api.KIND, namespace)).get("items", [])
    return items


def read_inference_deployment(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.request("GET", path(api.KIND, namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
