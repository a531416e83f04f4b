"""The engine check's controller side (``spec.readiness.engineCheck``; the contract is nodewarm.api.enginecheck).

The node agent asks on its own Node (annotation ``nodewarm.io/engine-check`` = a Request); the agent cannot create
the pod itself (on AL2023 it acts as the node, and NodeRestriction lets a node create only mirror pods), so the
controller does, from the profile's rendered PodTemplate, bound to that node; it deletes the pod once the node
reports the Outcome in the same annotation, when a newer request or a lifted taint leaves it unasked for, or when
the node is gone (the pod's ownerReference to its Node lets the garbage collector do the same).

  plan.py        pure: the node, its profile and its check pods in; what to create and delete, the Events and the
                 metrics out (and the pod, bound, from the template)
  controller.py  the shell: reads the live PodTemplate and the node's pods in the serving namespace (the Role
                 `nodewarm render` adds there is all it may do with pods), carries the plan out

The Warm condition itself is the agent's, and the NodeClaim phases read it as they always did: Warm=False after a
failed check waits for readiness.deadline, where onDeadline applies.
"""
