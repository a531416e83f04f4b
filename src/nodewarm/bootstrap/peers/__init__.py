"""Peers before S3 (docs/peers.md): the nodes of one profile feed each other the model's bytes, each verified as S3's.

auth       the signed request: what it names (object_path), the profile's keys, sign and verify
directory  which nodes can feed this one, read from their Node annotations (pure)
fetch      where a part of the pull comes from (a peer, its owner, S3) and reading it from a peer
holdings   what this node offers: each model's listed objects and which of them are verified here
openrange  what one request may read: an fd of the verified file or the journaled parts of a partial, confined
serve      the server: byte ranges of the models this node holds, to signed requests only, capped
peering    the agent's part: the key, the server, this node's annotation and the directory it follows
"""
