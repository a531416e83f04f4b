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
handler=@@HANDLER@@
if [ ! -x "$handler" ] || [ -e @@LAUNCH_FAILURE@@ ]; then
  exec "$runc" "$@"
fi
export @@ENV_RUNC@@="$runc" @@ENV_CRIU@@=@@CRIU@@ @@ENV_STORE@@=@@STORE@@
exec "$handler" "$@"
