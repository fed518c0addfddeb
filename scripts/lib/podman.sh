# Sourced. use_host_podman_config DIR: podman as it works on these hosts (runc, since crun fails
# on hybrid cgroups; cgroupfs; no default ulimits, which the sandbox may not raise), written to
# DIR/containers.conf and exported as CONTAINERS_CONF for this shell's podman calls.
use_host_podman_config() {
  cat >"$1/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  export CONTAINERS_CONF="$1/containers.conf"
}
