"""The pod policy every rendered vLLM pod must meet before anything is applied (issue 11).

A tenant's pod template (``spec.runtime.podTemplate``) is rendered by the operator and
applied with the operator's rights, so the template must not be able to ask for more than a
tenant could ask for directly. The policy is the Pod Security Standard the chart chooses
(``podPolicy.level``: ``baseline`` or ``restricted``, as Kubernetes defines them for v1.35)
plus kvtune's own rules, which no Pod Security level covers:

- no ``nodeName`` (it bypasses the scheduler and the pool's GPU placement);
- no ServiceAccount but ``default``, the runtime's ``kvtune-runtime`` and those the chart
  allows (``podPolicy.allowedServiceAccounts``, e.g. one with a cloud identity for weights);
- no toleration without a key (it tolerates every taint: control-plane nodes included);
- no ``system-*`` priority class (it preempts cluster components);
- no Secret reference (volume, projected source, CSI ``nodePublishSecretRef``, env
  ``secretKeyRef``, ``envFrom.secretRef``, ``imagePullSecrets``) but those the chart allows
  (``podPolicy.allowedSecrets``; none by default), and only the volume kinds of "restricted"
  (plus ``image``): kvtune renders no Secret reference, and the operator's token must not
  hand a tenant the namespace's Secrets (issue 25);
- no explicit root user (``runAsUser: 0``) and no ``allowPrivilegeEscalation: true``.

The chart's ValidatingAdmissionPolicy (``templates/admission-policy.yaml``) refuses the same
pods at the API server, whoever holds the operator's token.

GPU pods need nothing beyond that: an ``nvidia.com/gpu`` request and a memory-backed
``/dev/shm`` emptyDir are allowed at both levels. ``check`` is pure and returns the first
violation as one line naming the field, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Level = Literal["baseline", "restricted"]
LEVELS: tuple[Level, ...] = ("baseline", "restricted")
ALLOWED_SERVICE_ACCOUNTS = ("default", "kvtune-runtime")
# Pod Security "baseline": capabilities a container may add.
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})
# Pod Security "restricted": the only volume types.
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                "persistentVolumeClaim", "projected", "secret"})
# Both levels: the volume kinds the admission policy admits (none that carries a secretRef of
# its own or runs code on the node; a secret volume only of an allowed Secret).
TOKEN_VOLUMES = RESTRICTED_VOLUMES | {"image"}


@dataclass
class PolicyConfig:
    """Set by ``kvtune operator --pod-security`` (the chart's ``podPolicy.level``)."""

    level: Level = "baseline"
    # Besides ALLOWED_SERVICE_ACCOUNTS (the chart's podPolicy.allowedServiceAccounts).
    service_accounts: tuple[str, ...] = ()
    # The Secrets a pod may reference (the chart's podPolicy.allowedSecrets); none by default.
    secrets: tuple[str, ...] = ()


CONFIG = PolicyConfig()


class PolicyViolation(ValueError):
    """The pod asks for something the policy refuses; the message names field and fix."""


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            if isinstance(container, Mapping):
                yield f"spec.{kind}[{i}]", container


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    sc = obj.get("securityContext")
    return sc if isinstance(sc, Mapping) else {}


def _refuse(field: str, value: Any, why: str, fix: str, level: str) -> PolicyViolation:
    return PolicyViolation(f"{field}={value!r} is refused by the pod policy ({level}): {why}. "
                           f"Fix: {fix}")


def _kvtune_rules(spec: Mapping[str, Any], level: str) -> Iterator[PolicyViolation]:
    if spec.get("nodeName"):
        yield _refuse("spec.nodeName", spec["nodeName"], "it bypasses the scheduler and the "
                      "pool's GPU placement", "remove it; kvtune places pods by GPU class",
                      level)
    for key in ("serviceAccountName", "serviceAccount"):
        account = spec.get(key)
        allowed = (*ALLOWED_SERVICE_ACCOUNTS, *CONFIG.service_accounts)
        if account and account not in allowed:
            yield _refuse(f"spec.{key}", account, "the pods would run with another account's "
                          f"rights (allowed: {', '.join(allowed)})", "remove it, or ask the "
                          "platform team to add it to the chart's "
                          "podPolicy.allowedServiceAccounts", level)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        if isinstance(toleration, Mapping) and not toleration.get("key"):
            yield _refuse(f"spec.tolerations[{i}]", dict(toleration), "a toleration without a "
                          "key tolerates every taint, control-plane nodes included",
                          "name the taint's key (the GPU taint nvidia.com/gpu is tolerated "
                          "already)", level)
    priority = spec.get("priorityClassName")
    if isinstance(priority, str) and priority.startswith("system-"):
        yield _refuse("spec.priorityClassName", priority, "system priority classes preempt "
                      "cluster components", "use a priority class of your own", level)


def _secret_names(spec: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field, Secret name) of every Secret the pod references."""
    for i, volume in enumerate(spec.get("volumes") or []):
        if not isinstance(volume, Mapping):
            continue
        if "secret" in volume:
            yield f"spec.volumes[{i}].secret", (volume["secret"] or {}).get("secretName")
        for j, source in enumerate((volume.get("projected") or {}).get("sources") or []):
            if isinstance(source, Mapping) and "secret" in source:
                yield (f"spec.volumes[{i}].projected.sources[{j}].secret",
                       (source["secret"] or {}).get("name"))
        if "nodePublishSecretRef" in (volume.get("csi") or {}):
            yield (f"spec.volumes[{i}].csi.nodePublishSecretRef",
                   (volume["csi"]["nodePublishSecretRef"] or {}).get("name"))
    for i, ref in enumerate(spec.get("imagePullSecrets") or []):
        yield f"spec.imagePullSecrets[{i}]", ref.get("name") if isinstance(ref, Mapping) else ref
    for path, container in _containers(spec):
        for j, env in enumerate(container.get("env") or []):
            ref = (env.get("valueFrom") or {}) if isinstance(env, Mapping) else {}
            if "secretKeyRef" in ref:
                yield (f"{path}.env[{j}].valueFrom.secretKeyRef",
                       (ref["secretKeyRef"] or {}).get("name"))
        for j, env_from in enumerate(container.get("envFrom") or []):
            if isinstance(env_from, Mapping) and "secretRef" in env_from:
                yield f"{path}.envFrom[{j}].secretRef", (env_from["secretRef"] or {}).get("name")


def _secret_rules(spec: Mapping[str, Any], level: str) -> Iterator[PolicyViolation]:
    for i, volume in enumerate(spec.get("volumes") or []):
        if not isinstance(volume, Mapping):
            continue
        for kind in [k for k in volume if k != "name" and k not in TOKEN_VOLUMES]:
            yield _refuse(f"spec.volumes[{i}].{kind}", volume.get("name"), "only configMap, "
                          "csi, downwardAPI, emptyDir, ephemeral, image, persistentVolumeClaim, "
                          "projected and (allowed) secret volumes", "use one of those", level)
    for where, name in _secret_names(spec):
        if name not in CONFIG.secrets:
            allowed = ", ".join(CONFIG.secrets) or "none"
            yield _refuse(where, name, f"a Secret reference (allowed: {allowed})", "remove "
                          "it, or ask the platform team to add it to the chart's "
                          "podPolicy.allowedSecrets", level)


def _root_rules(spec: Mapping[str, Any], level: str) -> Iterator[PolicyViolation]:
    if _sc(spec).get("runAsUser") == 0:
        yield _refuse("spec.securityContext.runAsUser", 0, "kvtune's pods never ask for "
                      "root", "remove it or run as a non-zero user", level)
    for path, container in _containers(spec):
        sc = _sc(container)
        if sc.get("runAsUser") == 0:
            yield _refuse(f"{path}.securityContext.runAsUser", 0, "kvtune's pods never ask "
                          "for root", "remove it or run as a non-zero user", level)
        if sc.get("allowPrivilegeEscalation") is True:
            yield _refuse(f"{path}.securityContext.allowPrivilegeEscalation", True,
                          "kvtune's pods never ask for it", "remove it or set it to false",
                          level)


def _baseline(spec: Mapping[str, Any], metadata: Mapping[str, Any],
              level: str) -> Iterator[PolicyViolation]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            yield _refuse(f"spec.{key}", spec[key], "the pod would share the node's "
                          "namespaces", f"remove spec.{key}", level)
    for i, volume in enumerate(spec.get("volumes") or []):
        if isinstance(volume, Mapping) and "hostPath" in volume:
            yield _refuse(f"spec.volumes[{i}].hostPath", volume["hostPath"], "it mounts the "
                          "node's filesystem", "use an emptyDir, a ConfigMap or a "
                          "PersistentVolumeClaim", level)
    pod_sc = _sc(spec)
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        name = sysctl.get("name") if isinstance(sysctl, Mapping) else sysctl
        if name not in SAFE_SYSCTLS:
            yield _refuse(f"spec.securityContext.sysctls[{i}].name", name, "only the safe "
                          "sysctls are allowed", "remove it", level)
    for annotation, value in (metadata.get("annotations") or {}).items():
        if str(annotation).startswith("container.apparmor.security.beta.kubernetes.io/") \
                and value == "unconfined":
            yield _refuse(f"metadata.annotations[{annotation}]", value, "AppArmor must "
                          "confine the container", "remove the annotation", level)
    for where, sc in [("spec.securityContext", pod_sc)] + [
            (f"{path}.securityContext", _sc(c)) for path, c in _containers(spec)]:
        yield from _baseline_security_context(where, sc, level)
    for path, container in _containers(spec):
        sc = _sc(container)
        if sc.get("privileged"):
            yield _refuse(f"{path}.securityContext.privileged", True, "a privileged "
                          "container owns the node", "remove it; GPUs are reached through "
                          "the nvidia.com/gpu resource", level)
        added = ((sc.get("capabilities") or {}).get("add") or [])
        for cap in added:
            if cap not in BASELINE_CAPABILITIES:
                yield _refuse(f"{path}.securityContext.capabilities.add", cap, "only the "
                              "baseline capabilities may be added", "remove it", level)
        for j, port in enumerate(container.get("ports") or []):
            if isinstance(port, Mapping) and port.get("hostPort"):
                yield _refuse(f"{path}.ports[{j}].hostPort", port["hostPort"], "it binds a "
                              "port of the node", "remove it; the pool's Service exposes "
                              "vLLM", level)


def _baseline_security_context(where: str, sc: Mapping[str, Any],
                               level: str) -> Iterator[PolicyViolation]:
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        yield _refuse(f"{where}.windowsOptions.hostProcess", True, "a host process owns "
                      "the node", "remove it", level)
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield _refuse(f"{where}.seccompProfile.type", "Unconfined", "seccomp must confine "
                      "the container", "use RuntimeDefault", level)
    if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        yield _refuse(f"{where}.appArmorProfile.type", "Unconfined", "AppArmor must confine "
                      "the container", "use RuntimeDefault", level)
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") \
            or selinux.get("role"):
        yield _refuse(f"{where}.seLinuxOptions", dict(selinux), "custom SELinux users, roles "
                      "and types are refused", "remove them", level)
    if sc.get("procMount") not in (None, "Default"):
        yield _refuse(f"{where}.procMount", sc["procMount"], "/proc must stay masked",
                      "remove it", level)


def _restricted(spec: Mapping[str, Any], level: str) -> Iterator[PolicyViolation]:
    for i, volume in enumerate(spec.get("volumes") or []):
        if not isinstance(volume, Mapping):
            continue
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in RESTRICTED_VOLUMES:
                yield _refuse(f"spec.volumes[{i}].{kind}", volume.get("name"), "restricted "
                              "allows only configMap, csi, downwardAPI, emptyDir, ephemeral, "
                              "persistentVolumeClaim, projected and secret volumes",
                              "use one of those", level)
    pod_sc = _sc(spec)
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        yield _refuse("spec.securityContext.runAsUser", 0, "restricted refuses root",
                      "run as a non-zero user", level)
    for path, container in _containers(spec):
        sc = _sc(container)
        if sc.get("allowPrivilegeEscalation") is not False:
            yield _refuse(f"{path}.securityContext.allowPrivilegeEscalation",
                          sc.get("allowPrivilegeEscalation"), "restricted requires false",
                          "set it to false", level)
        if not (sc.get("runAsNonRoot") is True or (pod_non_root
                                                   and sc.get("runAsNonRoot") is not False)):
            yield _refuse(f"{path}.securityContext.runAsNonRoot", sc.get("runAsNonRoot"),
                          "restricted requires non-root", "set runAsNonRoot: true on the pod "
                          "or the container", level)
        if sc.get("runAsUser") == 0:
            yield _refuse(f"{path}.securityContext.runAsUser", 0, "restricted refuses root",
                          "run as a non-zero user", level)
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield _refuse(f"{path}.securityContext.seccompProfile.type", seccomp,
                          "restricted requires a seccomp profile", "set RuntimeDefault on the "
                          "pod or the container", level)
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            yield _refuse(f"{path}.securityContext.capabilities.drop", caps.get("drop"),
                          "restricted requires dropping ALL", "drop: [ALL]", level)
        for cap in caps.get("add") or []:
            if cap != "NET_BIND_SERVICE":
                yield _refuse(f"{path}.securityContext.capabilities.add", cap, "restricted "
                              "allows adding only NET_BIND_SERVICE", "remove it", level)


def violations(pod: Mapping[str, Any], level: Level) -> list[str]:
    """Every violation of ``pod`` (a pod template: metadata, spec), in field order."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(metadata, Mapping)
    found = [*_kvtune_rules(spec, level), *_baseline(spec, metadata, level),
             *_secret_rules(spec, level), *_root_rules(spec, level)]
    if level == "restricted":
        found += list(_restricted(spec, level))
    return [str(v) for v in found]


def check(pod: Mapping[str, Any], level: Level | None = None) -> None:
    """Raise ``PolicyViolation`` (the first violation, and how many more) when ``pod``
    breaks the policy."""
    found = violations(pod, level or CONFIG.level)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise PolicyViolation(found[0] + more)


# For operator/render/tenant_reach.py (what a tenant's spec may reach: images, named Secrets).
iter_containers = _containers
secret_names = _secret_names
