"""Replicas behind one router under SLURM (model.dp_lb router, issue 29): pure text, like every
launcher of kit.plan.slurm.

SLURM requeues a whole job or one task of a job array, never one node or one step of a running
job. So each replica is one task of a job array (`#SBATCH --array=0-(DP-1)`, each task the
replica's TP×PP GPUs over its nodes), and vLLM's router is a job of its own, on one node:

- The array launcher is kit's node launcher (the same includes, the same node step, the same
  ContainerSpec from plan_node) for one replica: task k runs replica k, planned as a cluster of
  its own (replica_config: DP 1, its nodes, its API port ports.replica + k and rendezvous port
  ports.mp_master + k, so that tasks SLURM puts on one node do not collide). Each task writes its
  replica's URL into its job comment (`scontrol update Comment=`), and with slurm.requeue a task
  whose replica fails after it was ready requeues itself alone (`scontrol requeue` of its own
  job id). With supervise.enabled each task's containers run kit's supervisor around the
  replica (its own settings and supervisor port): a failure inside the task is restarted in place.
- The router job (`sbatch kit-CLUSTER-router.sbatch ARRAY_JOB`, which `kit slurm --submit` runs)
  runs kit's router image (kit.plan.router, the same container `kit serve` starts) and keeps it in
  step with the array: a running task whose replica answers /health is added through the
  router's admin endpoint (POST /add_worker), one whose task left RUNNING (cancelled, failed,
  requeued) is removed. The replicas do not know the router; the router finds them through
  SLURM. Its own comment names the array job, so that `kit down --slurm` and `kit status --slurm`
  of the router's job reach the replicas too; cancelling it cancels the array.

The API key stays a file: the replicas mount it (vLLM checks every request), the router never
sees it (it checks a caller's key against the replicas' /v1/models: kit.plan.router), and the
router job sends it to the admin endpoint in a header curl reads from its standard input, never
in an argument.
"""

from __future__ import annotations

import dataclasses

from kit import __version__
from kit.config import KitConfig
from kit.plan.job_vars import argv_text, job_var, runtime_word
from kit.plan.node import ContainerSpec
from kit.plan.replicas import nodes_per_replica, plan_replicas, replica_gpus
from kit.plan.roles import HEAD, Role
from kit.plan.router import plan_router, router_name
from kit.plan.scripts import render_replicas, replica_part
from kit.plan.slurm import (
    JOB,
    JOB_LABEL,
    RANK_SENTINEL,
    SbatchResources,
    is_image_file,
    launcher_context,
    node_argv,
    node_exports,
    sbatch_line,
    sbatch_resources,
    slurm_spec,
    supervised_config,
)
from kit.plan.slurm_supervise import supervised
from kit.plan.supervise import supervise_json
from kit.plan.vllm import REPLICA_HEAD_VAR
from kit.render import EnvRef, render, shell_quote

ARRAY_JOB = job_var("SLURM_ARRAY_JOB_ID")
REPLICA_READY_MARK = "KIT_REPLICA_READY"
REPLICA_TIMEOUT_MARK = "KIT_REPLICA_TIMEOUT"
# The router job's comment: the replicas' array job (kit.runtime.slurm reads it back).
REPLICAS_COMMENT = "kit-replicas-job="
ROUTER_POLL_S = 2


def router_launcher_path(launcher: str) -> str:
    """The router job's file, beside the array launcher: kit-CLUSTER.sbatch -> kit-CLUSTER-router.sbatch."""
    stem, dot, ext = launcher.rpartition(".")
    if not dot or "/" in ext:
        return f"{launcher}-router"
    return f"{stem}-router.{ext}"


def slurm_describe(config: KitConfig) -> str:
    """`2 replica(s) of TP=1 PP=1, each over 1 node(s) of its own array task`: kit's own words."""
    return (
        f"{config.dp} replica(s) of TP={config.tp} PP={config.pp}, each over {nodes_per_replica(config)} "
        "node(s) of its own array task"
    )


def replica_config(config: KitConfig, index: int) -> KitConfig:
    """Replica `index` as a cluster of its own: DP 1 on its nodes (TP×PP GPUs), its API server at
    ports.replica + index, its rendezvous at ports.mp_master + index and (supervised) its
    supervisor at ports.supervisor + index."""
    ports = dataclasses.replace(
        config.ports,
        replica=config.ports.replica + index,
        mp_master=config.ports.mp_master + index,
        supervisor=config.ports.supervisor + index,
    )
    return config.replace(
        nodes=nodes_per_replica(config),
        gpus_per_node=min(config.gpus_per_node, replica_gpus(config)),
        planned=dataclasses.replace(config.layout, dp=1),
        ports=ports,
    )


def replica_scripts(config: KitConfig, index: int) -> dict[str, str]:
    """Replica `index`'s serve scripts (config: its replica_config): its first node's, and (over
    several nodes) the headless part every other node runs, its --node-rank that node's SLURM_NODEID."""
    [replica] = plan_replicas(config)
    # Without a record of the image's parser each container checks its `vllm serve` first (issue 24).
    check = config.image_options is None
    head = {**replica_part(config, replica, replica.head), "name": f"replica-{index}"}
    scripts = {
        "KIT_HEAD_SCRIPT": render_replicas(config, f"0 of array task {index}", [head], precheck=HEAD if check else None)
    }
    if replica.spans_nodes:
        part = replica_part(config, replica, replica.nodes[1], node_rank=EnvRef("KIT_NODE_RANK"))
        worker = Role("worker", RANK_SENTINEL) if check else None
        nodes = f"1 and up of array task {index}"
        scripts["KIT_WORKER_SCRIPT"] = render_replicas(
            config, nodes, [{**part, "name": f"replica-{index}"}], precheck=worker
        )
    return scripts


def array_spec(config: KitConfig, role: Role, script: str, index: int, args: tuple[str, ...] = ()) -> ContainerSpec:
    """A replica's node container: the node launcher's, labelled with the array's job id (so that
    `kit down --slurm ARRAY_JOB` finds every task's) and its replica; over several nodes it knows
    its replica's first node (the task's head)."""
    spec = slurm_spec(config, role, script, args)
    env = dict(spec.env)
    if nodes_per_replica(config) > 1:
        env[REPLICA_HEAD_VAR] = job_var("KIT_HEAD_ADDRESS")
    labels = {**spec.labels, JOB_LABEL: ARRAY_JOB, "kit.replica": str(index)}
    return dataclasses.replace(spec, env=env, labels=labels)


def array_tasks(config: KitConfig) -> list[dict[str, object]]:
    """Each array task's replica: its index, API port, scripts and node commands."""
    tasks: list[dict[str, object]] = []
    worker_role = Role("worker", RANK_SENTINEL)
    for replica in plan_replicas(config):
        rc = replica_config(config, replica.index)
        scripts = replica_scripts(rc, replica.index)
        head_args: tuple[str, ...] = ()
        worker_args: tuple[str, ...] = ()
        if config.supervise.enabled:
            # The replica is a supervised group of its own (kit.plan.supervise's replica settings,
            # without a router to call: the router's job follows the replicas' health itself).
            settings = supervise_json(supervised_config(rc), node=0)
            scripts, head_args, worker_args = supervised(rc, scripts, (), worker_role, settings=settings)
        head = array_spec(rc, HEAD, job_var("KIT_HEAD_SCRIPT"), replica.index, head_args)
        task: dict[str, object] = {
            "index": replica.index,
            "port": rc.ports.replica,
            "scripts": scripts,
            "head_cmd": argv_text(node_argv(rc, head)),
            "head_exports": node_exports(rc, head),
            "head_name": shell_quote(runtime_word(head.name)),
            "worker_cmd": None,
        }
        if "KIT_WORKER_SCRIPT" in scripts:
            worker = array_spec(rc, worker_role, job_var("KIT_WORKER_SCRIPT"), replica.index, worker_args)
            task["worker_cmd"] = argv_text(node_argv(rc, worker))
            task["worker_exports"] = node_exports(rc, worker)
            task["worker_name"] = shell_quote(runtime_word(worker.name))
        tasks.append(task)
    return tasks


def array_resources(config: KitConfig) -> SbatchResources:
    """One task's resources (a replica's nodes and GPUs), and the array of DP tasks."""
    return dataclasses.replace(sbatch_resources(replica_config(config, 0)), array=f"0-{config.dp - 1}")


def plan_replicas_launcher(config: KitConfig) -> str:
    """The array launcher: task k runs replica k (kit's node launcher for that replica)."""
    first = replica_config(config, 0)
    context = launcher_context(first, {})
    context.update(
        sbatch_lines=[sbatch_line(k, v) for k, v in array_resources(config).directives()],
        head_secrets=context["head_secrets"],
        tasks=array_tasks(config),
        replicas=config.dp,
        what=slurm_describe(config),
        # the readiness wait and its line are the task's replica's (its port is only known in the task)
        api_port="${KIT_REPLICA_PORT}",
        server_ready_mark=REPLICA_READY_MARK,
        server_timeout_mark=REPLICA_TIMEOUT_MARK,
        apptainer=config.runtime == "apptainer",
        job_tmp=True,
        node_function="kit_node_step",
        # This task alone: JOBID of an array's task that carries the array's own id would name
        # every task of the array (scontrol update, scontrol requeue).
        this_job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}",
    )
    return render("sbatch_replicas.sh.j2", **context)


def router_resources(config: KitConfig) -> SbatchResources:
    """The router's job: one node, no GPU, one CPU (it forwards requests), the same walltime,
    account, partition and output files as the replicas."""
    s = config.slurm
    return SbatchResources(
        job_name=f"{s.job_name}-router",
        nodes=1,
        gpus_per_task=None,
        time=s.time,
        output=s.output,
        error=s.error,
        account=s.account,
        partition=s.partition,
        qos=s.qos,
        cpus_per_task=1,
        requeue=s.requeue,
    )


def router_job_spec(config: KitConfig) -> ContainerSpec:
    """The router's container (kit.plan.router's, as `kit serve` starts it) on the job's node,
    named and labelled with the router job's id. The replicas whose /v1/models checks a caller's
    key are only known in the job: the job appends them to its arguments."""
    spec = plan_router(config, job_var("KIT_HEAD_ADDRESS"), [])
    return dataclasses.replace(
        spec, name=f"{router_name(config.cluster)}-{JOB}", labels={**spec.labels, JOB_LABEL: JOB}
    )


def plan_router_launcher(config: KitConfig) -> str:
    """The router's job: kit's router image in front of the array's replicas, kept in step with them."""
    spec = router_job_spec(config)
    context = launcher_context(config, {})
    context.update(
        sbatch_lines=[sbatch_line(k, v) for k, v in router_resources(config).directives()],
        what=slurm_describe(config),
        router_cmd=argv_text(node_argv(config, spec)),
        router_name=shell_quote(runtime_word(spec.name)),
        router_image=config.router.image,
        router_image_file=is_image_file(config, config.router.image),
        router_exports=node_exports(config, spec),
        apptainer=config.runtime == "apptainer",
        api_key_file=config.api_key_file,
        replica_port=config.ports.replica,
        replicas=config.dp,
        replicas_comment=REPLICAS_COMMENT,
        poll_s=ROUTER_POLL_S,
        job_tmp=False,
        node_function="this script",
        version=__version__,
    )
    return render("sbatch_router.sh.j2", **context)


def plan_router_files(config: KitConfig, launcher: str) -> dict[str, str]:
    """`kit slurm`'s files for router replicas: the array launcher, then the router's job."""
    return {launcher: plan_replicas_launcher(config), router_launcher_path(launcher): plan_router_launcher(config)}
