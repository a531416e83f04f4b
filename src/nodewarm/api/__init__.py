"""The contract between nodewarm's parts: what the node agent, the controller, `nodewarm status`, the renderer and
the demo must agree on, in one place.

Names on cluster objects (names), the agent's timeline keys (timeline), the controller's decisions, the defaults
the schema declares, the generation, the serving spec, the typed views of NodeClaims, Nodes and WarmProfiles,
the lifecycle derived from them, and the time helpers.

Standard library only, and nothing here imports the rest of nodewarm: every part imports this package, so it
must stay cheap (the node agent's start-up is on the warm-up's critical path) and can never sit in an import
circle. tests/packaging/test_imports.py holds it to both.
"""
