#!/bin/sh
# nodewarm-runc: containerd's runc shim runs this in runc's place (options.BinaryName of the snapshot runtime) for
# every runc call of the snapshot RuntimeClass's pods, and hands each to the runtime handler in the agent's
# artifact, which may turn a create into a CRIU restore. Until that artifact is unpacked, and when its launch
# failed (a record the agent removes once it runs), every call goes to runc unchanged: these pods then start as
# on the stock runtime, so a failed download never keeps them from starting.
# runc is found on the shim's PATH by its own name, which this script does not have.
if ! runc=$(command -v runc); then
  echo "nodewarm-runc: no runc on PATH ($PATH)" >&2
  exit 127
fi
# A boot goes where the stock runtime's would: on the NVIDIA AMI that is nvidia-container-runtime (runc with the hook
# that gives the container its GPUs), which nodeadm makes containerd's default when it is installed.
boot=$(command -v nvidia-container-runtime) || boot=$runc
handler=@@HANDLER@@
if [ ! -x "$handler" ] || [ -e @@LAUNCH_FAILURE@@ ]; then
  exec "$boot" "$@"
fi
export @@ENV_RUNC@@="$runc" @@ENV_BOOT@@="$boot" @@ENV_CRIU@@=@@CRIU@@ @@ENV_STORE@@=@@STORE@@
exec "$handler" "$@"
