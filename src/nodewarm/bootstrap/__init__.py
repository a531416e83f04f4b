"""The node agent. Two products, each in its own subpackage: ``weights`` (the model onto the NVMe RAID,
verified) and ``compilecache`` (signed compile-cache bundles: publish and restore). Beside them, what
both use or what ties them together: the S3 client (s3client), the report to the cluster (nodestatus),
the agent that runs both phases (agent, agent_cli) and the `nodewarm bootstrap` CLI (cli)."""
