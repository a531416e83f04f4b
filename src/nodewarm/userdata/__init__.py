"""How the bootstrap reaches a node and starts at the right moment.

* AL2023 (Karpenter): ``al2023.render_part`` + ``merge.merge`` give the EC2NodeClass userData: a shell part
  that installs a systemd unit ordered after nodeadm-run, which fetches the ``nodewarm package`` artifact.
* Bottlerocket and EKS Auto Mode: ``daemonset.manifests`` (no shell, no user data); ``bottlerocket.check``
  vets the user's Bottlerocket TOML.
* ``launch.BootstrapLaunch`` is the one input of every launcher.
"""
