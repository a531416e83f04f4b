"""The contract between nodewarm's parts: what the node agent, the controller, `nodewarm status`, the renderer and
the demo must agree on, in one place.

Names on cluster objects (names), the agent's timeline keys (timeline), the controller's decisions (decisions), the
WarmProfile schema (schema) and the defaults it declares (defaults), the WarmProfile typed (warmprofile), the
generation and the model's key (generation), where the weights and caches are on the node and in the pod
(podlayout), the serving spec vLLM and the compile-cache key share (servingspec), the image pre-pull pod's names
(prepullpod), the typed views of NodeClaims and Nodes (views), the lifecycle derived from them (lifecycle), the time
helpers (timeutil) and the errors all of them raise (errors).

Standard library only, and nothing here imports the rest of nodewarm: every part imports this package, so it
must stay cheap (the node agent's start-up is on the warm-up's critical path) and can never sit in an import
circle. tests/packaging/test_imports.py holds it to both.
"""
