"""Engine snapshots: a serving container warmed on the tainted node is checkpointed, and the node's runtime
restores it in place of a boot.

How the parts fit (docs/snapshots.md says why this way):

* ``runcargs.py`` (pure) reads a runc command line as containerd's shim writes it.
* ``key.py`` (pure) is what a restore depends on, read from a container's bundle and from the node.
* ``store.py`` keeps snapshots on the node: one slot per serving container, root-only, published whole or not at
  all, verified before use.
* ``checkpoint.py`` is the node's side that takes one (runc + CRIU, on a running container).
* ``handler.py`` is the runtime handler containerd runs instead of runc for the snapshot RuntimeClass: a create
  with a snapshot under the same key becomes a restore; anything else, and every failure, is plain runc.
"""
