"""Which cluster credentials a command uses: one function for the controller and the commands a person runs.

Both take ``--kubeconfig FILE`` first. Without it they differ on purpose, and the difference is one argument here:
the controller runs in a pod, so its ServiceAccount (``KUBERNETES_SERVICE_HOST`` set) comes before any kubeconfig
baked into the image; a person's command (`nodewarm status`, `render --diff`) takes ``$KUBECONFIG`` /
``~/.kube/config`` first, as kubectl does, and the pod's identity only where no file is found. The kubernetes client
is imported when a client is made, not when `nodewarm --help` imports a command.
"""

from __future__ import annotations

import os

from nodewarm.api.errors import NodewarmError


def api_client(kubeconfig: str | None, *, in_cluster_first: bool):
    from kubernetes import client, config

    cfg = client.Configuration()
    # $KUBECONFIG read now (the client reads it once, at import); a list of files is merged as kubectl does.
    path = kubeconfig or (None if in_cluster_first else os.environ.get("KUBECONFIG")) or None
    try:
        if path:
            config.load_kube_config(config_file=path, client_configuration=cfg)
        elif in_cluster_first and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        elif in_cluster_first:
            config.load_kube_config(client_configuration=cfg)
        else:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (config.ConfigException, OSError):
                config.load_incluster_config(client_configuration=cfg)
    except (config.ConfigException, OSError) as e:
        fix = ("pass --kubeconfig FILE or run in a pod with a ServiceAccount" if in_cluster_first
               else "pass --kubeconfig FILE or set $KUBECONFIG")
        raise NodewarmError(f"cannot load cluster credentials ({e}); {fix}", "NoCredentials") from None
    return client.ApiClient(cfg)
