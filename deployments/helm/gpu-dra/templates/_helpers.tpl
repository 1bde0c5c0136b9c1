{{/* Chart name, shortened to fit label values. */}}
{{- define "gpu-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name of every object (one release per cluster is expected). */}}
{{- define "gpu-dra.fullname" -}}
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

{{- define "gpu-dra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpu-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-dra.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-dra.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-dra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The kubelet's plugin directory of this driver: sockets, checkpoint, MPS pipe dirs. */}}
{{- define "gpu-dra.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) .Values.driverName }}
{{- end }}

{{- define "gpu-dra.registryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) }}
{{- end }}

{{/* ComputeDomains: the controller's, the compute-domain plugin's and the IMEX daemons' accounts. */}}
{{- define "gpu-dra.computeDomainControllerAccount" -}}
{{- printf "%s-compute-domain-controller" (include "gpu-dra.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-dra.computeDomainPluginAccount" -}}
{{- printf "%s-compute-domain-plugin" (include "gpu-dra.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-dra.imexDaemonAccount" -}}
{{- printf "%s-imex-daemon" (include "gpu-dra.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The compute-domain plugin's directory: sockets, checkpoint, IMEX configs. */}}
{{- define "gpu-dra.computeDomainPluginDir" -}}
{{- printf "%s/plugins/compute-domain.nvidia.com" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) }}
{{- end }}
