"""`nodewarm status`: where each warming node stands, from the cluster's own objects, read-only.

It derives nothing the controller also derives: pairing, which profile gates a pool and by which taint, when the
deadline starts and the phase come from nodewarm.api.lifecycle, over the views of nodewarm.api.views, as the
controller's planner reads them (tests/api/test_lifecycle_contract.py holds the two together). What is left here is
showing them, in five modules of one job each (as one module it had grown to 800 lines):

* observed: what is read (``Observed``: plain JSON dicts as the API server sends them) and the subjects shown
  (``Subject``: a NodeClaim and its Node, viewed, with the profile that gates them);
* rows: one table row per subject (phase and how long, weights, cache, deadline left, ...);
* explain: one node at length (its timeline, what it waits for, its last Events);
* text: the table and the explanation as text;
* cli: the thin I/O shell (list with the kubeconfig's identity, print) and the command's arguments.

Where each column comes from:

* phase: lifecycle.phase, from the NodeClaim's Karpenter conditions (Launched, Registered) and deletionTimestamp,
  the Node's startup taint, its ``nodewarm.io/Warm`` condition (the agent) and the controller's record
  ``nodewarm.io/state``; the reason is refined for two phases: Karpenter's own Launched reason while launching,
  and the agent step still running while warming;
* time in phase: the phase's start from the same objects (claim creation, Launched/Registered transition, the
  agent's timeline, the record's ``decided``, the deletionTimestamp);
* weights: while pulling, the agent's ``nodewarm.io/weights-progress`` (bytes done/total, written at most every
  30 s: nodewarm/bootstrap/agent.py ``LiveProgress``); once pulled, its ``nodewarm.io/weights`` summary;
* cache: ``nodewarm.io/compile-cache`` (hit/miss once serving proves it, cold at warm time); ``restored`` when
  the agent restored a bundle that serving has not judged yet;
* deadline: ``spec.readiness.deadline`` of the node's WarmProfile from lifecycle.deadline_start, in the phases
  lifecycle.DEADLINE_PHASES names.
"""
