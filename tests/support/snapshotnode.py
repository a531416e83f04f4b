"""A real node with nodewarm's snapshot handler, as the snapshot tests on real nodes need it: the helpers live in
nodewarm_dev.testenv.snapshotnode (the snapshot bench uses them too)."""

from nodewarm_dev.testenv.snapshotnode import checkpoint, container_log, create_runtime_class, handler_script

__all__ = ["checkpoint", "container_log", "create_runtime_class", "handler_script"]
