{{/* Names, labels and the pieces router and workers share. */}}

{{- define "kvserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvserve.router.name" -}}
{{- printf "%s-router" (include "kvserve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvserve.worker.name" -}}
{{- printf "%s-worker" (include "kvserve.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "kvserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kvserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "router"|"worker"). */}}
{{- define "kvserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvserve.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kvserve.componentLabels" -}}
{{ include "kvserve.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kvserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvserve.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-cpu" "" (eq .Values.worker.device "cpu"))) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "kvserve.authSecretName" -}}
{{- default (printf "%s-auth" (include "kvserve.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* CURVE keys (values curve.*): the Secret that holds them. */}}
{{- define "kvserve.curveSecretName" -}}
{{- default (printf "%s-curve" (include "kvserve.fullname" .)) .Values.curve.existingSecret }}
{{- end }}

{{/* The file that stands for the public key of `who` (router or worker): who.pub in a Secret
from kvserve-keygen; the chart's own Secret has secret keys only, and kvserve reads a secret-key
file where a public key is asked for as its public half. */}}
{{- define "kvserve.curvePublicFile" -}}
{{- .who }}.{{ if .ctx.Values.curve.existingSecret }}pub{{ else }}key{{ end }}
{{- end }}

{{/* The CURVE flags of `own` (router or worker), its keys mounted at /etc/kvserve/curve. */}}
{{- define "kvserve.curveArgs" -}}
{{- if .ctx.Values.curve.enabled }}
- --curve-secret-key-file
- /etc/kvserve/curve/{{ .own }}.key
{{- if eq .own "router" }}
- --curve-server-key-file
- /etc/kvserve/curve/{{ include "kvserve.curvePublicFile" (dict "ctx" .ctx "who" "worker") }}
{{- else }}
- --curve-allowed-clients-dir
- /etc/kvserve/curve/clients
{{- end }}
{{- else if eq .own "worker" }}
- --insecure
{{- end }}
{{- end }}

{{/* The volume of those keys: own secret key, and the peer's public one. */}}
{{- define "kvserve.curveVolume" -}}
{{- if .ctx.Values.curve.enabled }}
{{- $peer := include "kvserve.curvePublicFile" (dict "ctx" .ctx "who" (ternary "worker" "router" (eq .own "router"))) }}
- name: curve
  secret:
    secretName: {{ include "kvserve.curveSecretName" .ctx }}
    # Readable by the pods' fsGroup (podSecurityContext), not by others.
    defaultMode: 0440
    items:
      - key: {{ .own }}.key
        path: {{ .own }}.key
      - key: {{ $peer }}
        path: {{ if eq .own "router" }}{{ $peer }}{{ else }}clients/{{ $peer }}{{ end }}
{{- end }}
{{- end }}

{{- define "kvserve.curveMount" -}}
{{- if .Values.curve.enabled }}
- name: curve
  mountPath: /etc/kvserve/curve
  readOnly: true
{{- end }}
{{- end }}

{{/* Where the model directory is inside every container. */}}
{{- define "kvserve.modelDir" -}}
{{- $sub := .Values.model.subPath | trimPrefix "/" | trimSuffix "/" }}
{{- if $sub }}/models/{{ $sub }}{{ else }}/models{{ end }}
{{- end }}

{{- define "kvserve.checkModel" -}}
{{- $m := .Values.model }}
{{- $sources := 0 }}
{{- if $m.existingClaim }}{{ $sources = add1 $sources }}{{ end }}
{{- if $m.hostPath }}{{ $sources = add1 $sources }}{{ end }}
{{- if $m.fill.enabled }}{{ $sources = add1 $sources }}{{ end }}
{{- if ne $sources 1 }}
{{- fail "model: set exactly one of model.existingClaim, model.hostPath, model.fill.enabled" }}
{{- end }}
{{- if and $m.fill.enabled (not (or $m.fill.uri $m.fill.path)) }}
{{- fail "model.fill: set model.fill.uri or model.fill.path" }}
{{- end }}
{{- if and $m.fill.path (not $m.fill.sourceVolume) }}
{{- fail "model.fill.path needs model.fill.sourceVolume" }}
{{- end }}
{{- end }}

{{/* The model volume of a pod, read-only; a filled model lives in a PVC (workers) or an
     emptyDir (routers): (dict "ctx" $ "filledBy" "pvc"|"emptyDir"). */}}
{{- define "kvserve.modelVolumes" -}}
{{- $m := .ctx.Values.model }}
{{- if $m.existingClaim }}
- name: model
  persistentVolumeClaim:
    claimName: {{ $m.existingClaim }}
    readOnly: true
{{- else if $m.hostPath }}
- name: model
  hostPath:
    path: {{ $m.hostPath }}
    type: Directory
{{- else if eq .filledBy "emptyDir" }}
- name: model
  emptyDir: {}
{{- end }}
{{- if and $m.fill.enabled $m.fill.path }}
- name: model-source
  {{- toYaml $m.fill.sourceVolume | nindent 2 }}
{{- end }}
{{- end }}

{{/* The init container that fills the model volume once (a marker file records it). */}}
{{- define "kvserve.modelFill" -}}
{{- $f := .Values.model.fill }}
{{- if $f.enabled }}
- name: model-fill
  image: {{ $f.image }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-ec"]
  args:
    - |
      set -o pipefail
      if [ -e /models/.kvserve-filled ]; then exit 0; fi
      {{- if $f.uri }}
      case "$SOURCE_URI" in
        *.tar.gz|*.tgz) wget -qO- "$SOURCE_URI" | tar -xzf - -C /models ;;
        *.tar) wget -qO- "$SOURCE_URI" | tar -xf - -C /models ;;
        *) echo "model.fill.uri must end in .tar, .tar.gz or .tgz: $SOURCE_URI" >&2; exit 1 ;;
      esac
      {{- else }}
      cp -R "/source/$SOURCE_PATH/." /models/
      {{- end }}
      touch /models/.kvserve-filled
  env:
    - name: SOURCE_URI
      value: {{ $f.uri | quote }}
    - name: SOURCE_PATH
      value: {{ $f.path | trimPrefix "/" | quote }}
  volumeMounts:
    - name: model
      mountPath: /models
    {{- if $f.path }}
    - name: model-source
      mountPath: /source
      readOnly: true
    {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with $f.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Command-line flags from a map of flag name (no dashes) -> value: "--name value", booleans
     as "--name=true", null values dropped; (dict "flags" MAP "reserved" LIST "what" "worker.engine"). */}}
{{- define "kvserve.flagArgs" -}}
{{- range $name, $value := .flags }}
{{- if has $name $.reserved }}
{{- fail (printf "%s.%s: the chart sets --%s itself; use the chart's own value for it" $.what $name $name) }}
{{- end }}
{{- if hasPrefix "-" $name }}
{{- fail (printf "%s: write flag names without dashes (%s)" $.what $name) }}
{{- end }}
{{- if kindIs "bool" $value }}
- {{ printf "--%s=%t" $name $value | quote }}
{{- else if kindIs "invalid" $value }}
{{- else if or (kindIs "map" $value) (kindIs "slice" $value) }}
{{- fail (printf "%s.%s: a flag value must be a string, number or boolean" $.what $name) }}
{{- else }}
- {{ printf "--%s" $name | quote }}
- {{ include "kvserve.scalar" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* A scalar as text; whole numbers without the float formatting YAML parsing gives them. */}}
{{- define "kvserve.scalar" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* tmp and cache: writable, as the root filesystem is read-only. */}}
{{- define "kvserve.scratchVolumes" -}}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
{{- end }}

{{- define "kvserve.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /var/cache/kvserve
{{- end }}

{{- define "kvserve.scratchEnv" -}}
- name: HOME
  value: /var/cache/kvserve
- name: XDG_CACHE_HOME
  value: /var/cache/kvserve
- name: CUDA_CACHE_PATH
  value: /var/cache/kvserve/nv
{{- end }}

{{/* The routers' --workers entries for the upstream bridges: SERVICE.NAMESPACE.svc:PORT:EVENTS. */}}
{{- define "kvserve.upstreamWorkers" -}}
{{- $out := list }}
{{- range $u := .Values.upstreams }}
{{- $name := printf "%s-upstream-%s" (include "kvserve.fullname" $) $u.name | trunc 63 | trimSuffix "-" }}
{{- $out = append $out (printf "%s.%s.svc:%s:%s" $name $.Release.Namespace (include "kvserve.scalar" $.Values.worker.port) (include "kvserve.scalar" $.Values.worker.eventsPort)) }}
{{- end }}
{{- join "," $out }}
{{- end }}
