"""The engine check (readiness.engineCheck): the runner in the check pod and the node agent's side of it.

nodewarm.api.enginecheck says how the parts fit; judge.py decides from what the engine showed, runner.py boots it
(`nodewarm engine-check`), request.py is the agent asking for the check and reading its answer.
"""
