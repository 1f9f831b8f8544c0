{{/*
The pod rules of the operator-pods admission policies (templates/admission-policy.yaml), one
set for every pod template the operator writes: a Deployment's and a Job's spec.template, and
both of a LeaderWorkerSet's (spec.leaderWorkerTemplate.leaderTemplate, which is optional: the
workerTemplate is the leader's when it is absent, and .workerTemplate). operator/render/pod_policy.py
refuses the same things first, with a message naming the field.

Called with a dict: template (the CEL expression of the pod template), where (its path, for
the messages), accounts, secrets, secretList, baselineCaps, safeSysctls.
*/}}
{{- define "kvtune.podRules" -}}
variables:
  # The pod template the rules read: the policy's own (a Deployment's or Job's, or one of
  # a LeaderWorkerSet's two).
  - name: template
    expression: {{ .template | quote }}
  - name: pod
    expression: "variables.template.spec"
  # Every container that runs: kvtune renders no ephemeral containers (refused below).
  - name: containers
    expression: >-
      variables.pod.containers +
      (has(variables.pod.initContainers) ? variables.pod.initContainers : [])
  # The security contexts of the pod and of each container: the same rules on both.
  - name: contexts
    expression: >-
      (has(variables.pod.securityContext) ? [dyn(variables.pod.securityContext)] : []) +
      variables.containers.filter(c, has(c.securityContext)).map(c, dyn(c.securityContext))
validations:
  - expression: >-
      !((has(variables.pod.hostNetwork) && variables.pod.hostNetwork) ||
        (has(variables.pod.hostPID) && variables.pod.hostPID) ||
        (has(variables.pod.hostIPC) && variables.pod.hostIPC))
    message: "kvtune: {{ .where }}.spec.hostNetwork/hostPID/hostIPC is refused"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.volumes) ||
      variables.pod.volumes.all(v, !has(v.hostPath))
    message: "kvtune: {{ .where }}.spec.volumes[].hostPath is refused"
    reason: Forbidden
  # The volume kinds of Pod Security "restricted" (kvtune renders an emptyDir /dev/shm, a
  # tenant's template may add PVCs, ConfigMaps, CSI, projections): none of the kinds that
  # carry a secretRef of their own (cephfs, rbd, iscsi, flexVolume, azureFile, scaleIO,
  # storageos) or run code on the node (gitRepo).
  - expression: >-
      !has(variables.pod.volumes) ||
      variables.pod.volumes.all(v, dyn(v).all(k, k in
        ['name', 'configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral',
         'persistentVolumeClaim', 'projected', 'secret', 'image']))
    message: "kvtune: {{ .where }}.spec.volumes[] may only be configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret or image"
    reason: Forbidden
  # No Secret reference but the chart's podPolicy.allowedSecrets (kvtune renders none):
  # volumes, projections, CSI, env, envFrom, image pull secrets.
  - expression: >-
      !has(variables.pod.volumes) ||
      variables.pod.volumes.all(v,
        (!has(v.secret) || (has(v.secret.secretName) && v.secret.secretName in {{ .secretList }})) &&
        (!has(v.projected) || !has(v.projected.sources) ||
         v.projected.sources.all(s, !has(s.secret) ||
           (has(s.secret.name) && s.secret.name in {{ .secretList }}))) &&
        (!has(v.csi) || !has(v.csi.nodePublishSecretRef) ||
         (has(v.csi.nodePublishSecretRef.name) &&
          v.csi.nodePublishSecretRef.name in {{ .secretList }})))
    message: "kvtune: a Secret volume, projected Secret or CSI nodePublishSecretRef is refused unless the chart's podPolicy.allowedSecrets names it (allowed: {{ .secrets | join ", " | default "none" }})"
    reason: Forbidden
  - expression: >-
      variables.containers.all(c,
        (!has(c.env) || c.env.all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef) ||
           (has(e.valueFrom.secretKeyRef.name) &&
            e.valueFrom.secretKeyRef.name in {{ .secretList }}))) &&
        (!has(c.envFrom) || c.envFrom.all(e, !has(e.secretRef) ||
           (has(e.secretRef.name) && e.secretRef.name in {{ .secretList }}))))
    message: "kvtune: a container's env valueFrom.secretKeyRef or envFrom.secretRef is refused unless the chart's podPolicy.allowedSecrets names it (allowed: {{ .secrets | join ", " | default "none" }})"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.imagePullSecrets) ||
      variables.pod.imagePullSecrets.all(r, has(r.name) && r.name in {{ .secretList }})
    message: "kvtune: {{ .where }}.spec.imagePullSecrets is refused unless the chart's podPolicy.allowedSecrets names it (allowed: {{ .secrets | join ", " | default "none" }})"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.ephemeralContainers) || size(variables.pod.ephemeralContainers) == 0
    message: "kvtune: {{ .where }}.spec.ephemeralContainers is refused"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.nodeName)
    message: "kvtune: {{ .where }}.spec.nodeName is refused (it bypasses the scheduler)"
    reason: Forbidden
  # The endpoint pickers' account (routing.enabled) only on the Deployments kvtune renders
  # for them (operator/routing/endpoint_picker.py), never on a model server's pods. The
  # deprecated serviceAccount too: the API server makes it the pod's serviceAccountName when
  # that is unset, and a custom resource's template (a LeaderWorkerSet's) is stored as
  # written, so the alias reaches the pods unconverted.
  - expression: >-
      [has(variables.pod.serviceAccountName) ? variables.pod.serviceAccountName : '',
       has(variables.pod.serviceAccount) ? variables.pod.serviceAccount : ''].all(a,
        a == '' || a in {{ .accounts | toJson | replace "\"" "'" }}
        {{- if .picker }} ||
        (a == 'kvtune-endpoint-picker' &&
         has(object.metadata.labels) && 'kvtune.io/endpoint-picker' in object.metadata.labels)
        {{- end }})
    message: "kvtune: {{ .where }}.spec.serviceAccountName (or serviceAccount) may only be one of {{ .accounts | join ", " }}{{ if .picker }} (and kvtune-endpoint-picker for an endpoint picker){{ end }}"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.tolerations) ||
      variables.pod.tolerations.all(t, has(t.key) && t.key != '')
    message: "kvtune: a toleration without a key (tolerating every taint) is refused"
    reason: Forbidden
  - expression: >-
      !has(variables.pod.priorityClassName) ||
      !variables.pod.priorityClassName.startsWith('system-')
    message: "kvtune: a system-* priority class is refused"
    reason: Forbidden
  - expression: >-
      variables.containers.all(c,
        !(has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged))
    message: "kvtune: a privileged container (or init container) is refused"
    reason: Forbidden
  - expression: >-
      variables.containers.all(c,
        !(has(c.ports) && c.ports.exists(p, has(p.hostPort) && p.hostPort != 0)))
    message: "kvtune: a hostPort (in a container or an init container) is refused"
    reason: Forbidden
  - expression: >-
      variables.containers.all(c,
        !(has(c.securityContext) && has(c.securityContext.allowPrivilegeEscalation) &&
          c.securityContext.allowPrivilegeEscalation))
    message: "kvtune: securityContext.allowPrivilegeEscalation true is refused"
    reason: Forbidden
  # Pod Security baseline's capabilities (operator/render/pod_policy.py BASELINE_CAPABILITIES).
  - expression: >-
      variables.containers.all(c,
        !has(c.securityContext) || !has(c.securityContext.capabilities) ||
        !has(c.securityContext.capabilities.add) ||
        c.securityContext.capabilities.add.all(cap, cap in
          {{ .baselineCaps | toJson | replace "\"" "'" }}))
    message: "kvtune: securityContext.capabilities.add beyond Pod Security baseline's is refused"
    reason: Forbidden
  - expression: >-
      variables.contexts.all(sc, !has(sc.runAsUser) || sc.runAsUser != 0)
    message: "kvtune: securityContext.runAsUser 0 (root) is refused"
    reason: Forbidden
  - expression: >-
      variables.contexts.all(sc,
        (!has(sc.seccompProfile) || sc.seccompProfile.type != 'Unconfined') &&
        (!has(sc.appArmorProfile) || sc.appArmorProfile.type != 'Unconfined'))
    message: "kvtune: securityContext seccompProfile or appArmorProfile Unconfined is refused"
    reason: Forbidden
  - expression: >-
      variables.contexts.all(sc,
        (!has(sc.procMount) || sc.procMount == 'Default') &&
        (!has(sc.windowsOptions) || !has(sc.windowsOptions.hostProcess) ||
         !sc.windowsOptions.hostProcess) &&
        (!has(sc.seLinuxOptions) ||
         (!has(sc.seLinuxOptions.user) && !has(sc.seLinuxOptions.role) &&
          (!has(sc.seLinuxOptions.type) || sc.seLinuxOptions.type in
            ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']))))
    message: "kvtune: securityContext procMount, windowsOptions.hostProcess or a custom seLinuxOptions is refused"
    reason: Forbidden
  # Pod Security baseline's safe sysctls (operator/render/pod_policy.py SAFE_SYSCTLS).
  - expression: >-
      !has(variables.pod.securityContext) || !has(variables.pod.securityContext.sysctls) ||
      variables.pod.securityContext.sysctls.all(s, s.name in
        {{ .safeSysctls | toJson | replace "\"" "'" }})
    message: "kvtune: {{ .where }}.spec.securityContext.sysctls beyond the safe set is refused"
    reason: Forbidden
  - expression: >-
      !has(variables.template.metadata) || !has(variables.template.metadata.annotations) ||
      variables.template.metadata.annotations.all(k,
        !k.startsWith('container.apparmor.security.beta.kubernetes.io/') ||
        variables.template.metadata.annotations[k] != 'unconfined')
    message: "kvtune: an AppArmor unconfined annotation is refused"
    reason: Forbidden
{{- end -}}
