"""The node's model cache: the models this node holds under ``<NVMe>/nodewarm/models/`` (docs/models.md).

warmer      one model onto the node: its weights (S3, peers, links), its compile cache, its report entry
modelset    the profile's further models after Warm: pulled in the background, rolled, evicted (the I/O)
plan        which models to hold in what order, which folders pods use, what may not make room (pure)
report      what the node reports about its models (nodewarm.io/models), written when it changed
store       the folders held, the least-recently-used eviction plan (pure) and crash-safe eviction
background  the settings of a pull that runs while the node serves (spec.weights.background)
"""
