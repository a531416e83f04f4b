"""What nodewarm knows of Karpenter, reproduced from its Go code: its API types, the drift hashes it stamps, the
CRDs, and when it replaces nodes. Nothing here talks to a cluster or knows a WarmProfile.

- ``gotypes``: the Go type model (scalars, pointers, slices, maps, structs with tags and markers), Go's zero values.
- ``gojson``: Go's encoding/json: JSON decoded into those types as ``json.Unmarshal`` fills them, and Marshal's text.
- ``hashstructure``: mitchellh/hashstructure v2's walk (FNV-1 64, slices as sets, zero values skipped) over a value.
- ``apis``: Karpenter's NodePool, NodeClaim and EC2NodeClass types as its Go code declares them, markers included.
- ``crds``: the NodePool, NodeClaim and EC2NodeClass CRDs, generated from ``apis``.
- ``drifthash``: the drift hashes Karpenter stamps (``NodePool.Hash()``, ``EC2NodeClass.Hash(caBundle)``).
- ``drift``: Karpenter's drift checks: does an edit change a hash, which reason a NodeClaim is drifted for.
- ``driftpreview``: which live NodeClaims a change would drift, and why (``render --diff``, the WouldDrift guard).
- ``drift_cli``: ``nodewarm drift hash``, the drift hash of each NodePool and EC2NodeClass in a file.
"""
