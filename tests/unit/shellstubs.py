"""Stub binaries for running kit's generated shell without a cluster: SLURM (srun, squeue,
scontrol, sbatch), iproute2 and host tools (ip, hostname, getent, curl, ssh), the engines (vllm,
ray, python3 for the Ray barrier and version check) and the container runtimes (docker,
apptainer, and pyxis/the CSCS Container Engine inside srun). Fakes, because these tests run the
artefacts with arbitrary hostile values in every field (and enroot, pyxis and Apptainer cannot be
installed here); the real components run in tests/integration and tests/slurm.

Every stub appends its argv to $KIT_RECORD (one file per call, NUL-separated words: a value can
hold anything but NUL), so a test can check that each value arrived verbatim as one word. The
container stubs start the "container": its --env values in the environment, its command under
bash, with kit's container paths (/tmp/kit, /run/kit/secrets) mapped into a private root
($KIT_CONTAINER_ROOT/...) the way bind mounts would present them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

RECORD = 'printf \'%s\\0\' "${0##*/}" "$@" > "${KIT_RECORD}/${EPOCHREALTIME/./}.$$.${RANDOM}"\n'

# What SLURM and the host tools answer on a one-node job on node1 (10.9.0.1 on ib0), recording
# nothing: the SLURM launcher tests (test_slurm.py, test_dp.py) write these bodies under #!/bin/bash.
HOST_STUBS = {
    "scontrol": "echo node1\n",
    "getent": 'echo "10.9.0.1      STREAM node1"\n',
    "ip": r"""case "$*" in
  *"route get"*) echo "$4 dev ib0 src 10.9.0.1 uid 0" ;;
  *"addr show"*) echo "3: ib0    inet 10.9.0.1/16 brd 10.9.255.255 scope global ib0" ;;
esac
""",
    "squeue": 'echo "1:00:00"\n',
    "curl": "exit 0\n",
    "hostname": "echo node1\n",
    # srun: run the step's command once, as node 0 (the real srun runs it on every node).
    "srun": 'while [ "${1#-}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
}

BASH_STUBS = {
    "vllm": RECORD,
    # ray start of a worker succeeds once, then fails: with timeouts.join 0 the worker's rejoin
    # loop ends (there is no raylet to watch). `ray start --head --block` blocks like the real one
    # for KIT_STUB_RAY_BLOCK seconds (the SLURM head's entry must see its barrier line first).
    "ray": RECORD
    + """if [ "$1" = start ] && [ "$2" != --head ]; then
  if [ -e "${KIT_RECORD}/.joined" ]; then exit 1; fi
  : > "${KIT_RECORD}/.joined"
fi
case " $* " in *" --head "*) : > "${KIT_RECORD}/.head" ;; esac
case " $* " in *" --block "*) exec /bin/sleep "${KIT_STUB_RAY_BLOCK:-0}" ;; esac
""",
    # `python3 -c BARRIER NODES RESOURCE EXPECTED ...` (kit/cluster/ray_barrier.py's text) is the
    # Ray head's barrier: once the head started (as the real barrier waits for the GCS), report
    # the cluster complete; a head that never starts fails it within 30 s (it used to report the
    # cluster complete anyway after 5 s, which hid the head's absence). `python3 - check ...` is
    # kit's image check of a launcher written without a record of the image (issue 24): the
    # image passes it.
    "python3": RECORD
    + """if [ "$1" = - ] && [ "${2:-}" = check ]; then exec /bin/cat >/dev/null; fi
if [ "$1" = -c ] && [[ "$2" == *"kit: the Ray head's barrier."* ]]; then
  for _ in {1..3000}; do [ -e "${KIT_RECORD}/.head" ] && break; /bin/sleep 0.01; done
  if [ ! -e "${KIT_RECORD}/.head" ]; then echo "FAKE barrier: the Ray head never started" >&2; exit 1; fi
  echo "KIT_READY nodes=$3 $4=$5"
fi
""",
    "curl": RECORD,
    "ssh": RECORD,
    "sbatch": RECORD + "echo 4242\n",
    "squeue": RECORD + HOST_STUBS["squeue"],
    # `scontrol show hostnames`: node1..nodeN, the job's nodes in order (the head first), in one
    # write like the real one (the launcher reads the first line: `| head -n 1` under pipefail).
    "scontrol": RECORD + 'exec seq -f "node%g" 1 "${SLURM_JOB_NUM_NODES:-1}"\n',
    "getent": RECORD + HOST_STUBS["getent"],
    "hostname": RECORD + 'if [ "${1:-}" = -I ]; then echo 10.9.0.1; else echo node1; fi\n',
    "ip": RECORD + HOST_STUBS["ip"],
    # The mp node holds its container with `sleep infinity`; the wait loops sleep seconds: a short
    # real pause instead (a loop waiting for something must not spin).
    "sleep": 'if [ "$1" = infinity ]; then exit 0; fi\nexec /bin/sleep 0.02\n',
    # cat inside a "container": kit's secret files are read where the bind mount put them.
    "cat": """case "${1:-}" in
  /run/kit/*) exec /bin/cat "${KIT_CONTAINER_ROOT:?not in a container}$1" ;;
esac
exec /bin/cat "$@"
""",
}

CONTAINER = f"""#!{sys.executable}
# docker run / apptainer exec as a stub: record, then run the command like the container would.
import os, shutil, subprocess, sys, tempfile, time
record = os.environ["KIT_RECORD"]
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.path.join(record, f"{{time.time_ns() // 1000}}.{{os.getpid()}}"), "wb") as f:
    f.write(b"".join(os.fsencode(a) + b"\\0" for a in [name, *args]))
if name == "docker" and args[:1] != ["run"] or name == "apptainer" and args[:1] != ["exec"]:
    sys.exit(0)  # docker stop, ...
env, mounts, i = dict(os.environ), {{}}, 1
if name == "apptainer":
    # Apptainer's environment: NAME from APPTAINERENV_NAME (kit never passes --env: a comma list).
    if any(a == "--env" or a.startswith("--env=") for a in args):
        sys.exit("FAKE apptainer: --env splits values at commas; kit must not use it")
    given = {{k[len("APPTAINERENV_"):]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}
    env.update(given)
    with open(os.path.join(record, f"{{time.time_ns() // 1000 + 1}}.{{os.getpid()}}"), "wb") as f:
        words = ["apptainer-env", *(f"{{k}}={{v}}" for k, v in given.items())]
        f.write(b"".join(os.fsencode(a) + b"\\0" for a in words))
while args[i].startswith("-"):
    flag, _, value = args[i].partition("=")
    if flag == "--env":
        key, _, val = value.partition("=")
        env[key] = val
    elif flag in ("--volume", "--bind"):
        source, target = value.removesuffix(":ro").rsplit(":", 1)
        mounts[target] = source
    i += 1
image, command = args[i], args[i + 1:]
if name == "apptainer":
    assert command[0] == "/bin/bash", command
    command = command[1:]
root = tempfile.mkdtemp(prefix="root-", dir=os.environ["KIT_CONTAINERS"])
for target, source in mounts.items():
    if target.startswith("/run/kit/") and os.path.isfile(source):
        os.makedirs(os.path.dirname(root + target), exist_ok=True)
        shutil.copy(source, root + target)
for key, val in list(env.items()):
    if val == "/tmp/kit" or val.startswith(("/tmp/kit/", "/run/kit/")):
        env[key] = root + val
env["KIT_CONTAINER_ROOT"] = root
sys.exit(subprocess.run(["/bin/bash", *command], env=env, cwd=root).returncode)
"""


# srun: pyxis-aware (tests/pyxis_fake.py checks the container options and refuses what pyxis does
# not have). Without container options it runs the step once per node of the step, node 0 first
# (the real srun runs them at once); the workers' step (--exclude=HEAD) starts after the head's.
# With them it "starts the container": the environment (srun's, or the EDF's [env]) and the
# mounts mapped into a private root, as CONTAINER does for docker and apptainer.
SRUN = f"""#!{sys.executable}
import os, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.pyxis_fake import Invalid, check_pyxis, fail, parse, read_edf
record = os.environ["KIT_RECORD"]
args = sys.argv[1:]
with open(os.path.join(record, f"{{time.time_ns() // 1000}}.{{os.getpid()}}"), "wb") as f:
    f.write(b"".join(os.fsencode(a) + b"\\0" for a in ["srun", *args]))
try:
    step = parse(args)
    env = dict(os.environ)
    mounts, given = [], {{}}
    if step.pyxis:
        mounts, names = check_pyxis(step, env)
        given = {{name: env[name] for name in names}}
    elif step.environment is not None:
        data, mounts = read_edf(step.environment)
        given = data.get("env", {{}})
        env.update(given)
except Invalid as exc:
    fail(str(exc))
if step.container:  # what the container environment holds, recorded like a call
    with open(os.path.join(record, f"{{time.time_ns() // 1000 + 1}}.{{os.getpid()}}"), "wb") as f:
        words = ["container-env", *(f"{{k}}={{v}}" for k, v in given.items())]
        f.write(b"".join(os.fsencode(a) + b"\\0" for a in words))
nodes = list(range(int(env.get("SLURM_JOB_NUM_NODES", "1"))))
options = dict(o.partition("=")[::2] for o in step.srun)
if "--nodelist" in options:
    nodes = [k for k in nodes if f"node{{k + 1}}" == options["--nodelist"]]
if "--exclude" in options:
    nodes = [k for k in nodes if f"node{{k + 1}}" != options["--exclude"]]
    for _ in range(6000):  # the head's step first, as node 0 first above
        if os.path.exists(os.path.join(record, ".head-step-done")):
            break
        time.sleep(0.01)
rc = 0
for k in nodes:
    print("task prolog: a site's TaskProlog may print to the task's output", flush=True)
    task = dict(env, SLURM_NODEID=str(k), SLURMD_NODENAME=f"node{{k + 1}}")
    cwd = None
    if step.container:
        cwd = tempfile.mkdtemp(prefix="root-", dir=env["KIT_CONTAINERS"])
        for m in mounts:
            if m.target.startswith("/run/kit/") and os.path.isfile(m.source):
                os.makedirs(os.path.dirname(cwd + m.target), exist_ok=True)
                shutil.copy(m.source, cwd + m.target)
        for key, val in list(task.items()):
            if val == "/tmp/kit" or val.startswith(("/tmp/kit/", "/run/kit/")):
                task[key] = cwd + val
        task["KIT_CONTAINER_ROOT"] = cwd
    rc = subprocess.run(step.command, env=task, cwd=cwd).returncode or rc
if "--nodelist" in options:
    open(os.path.join(record, ".head-step-done"), "w").close()
sys.exit(rc)
"""


@dataclass(frozen=True)
class Stubs:
    bin: Path

    def env(self, record: Path, containers: Path, **extra: str) -> dict[str, str]:
        import os

        return {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "KIT_RECORD": str(record),
            "KIT_CONTAINERS": str(containers),
            **extra,
        }


def make_stubs(directory: Path) -> Stubs:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in BASH_STUBS.items():
        (directory / name).write_text("#!/bin/bash\n" + body)
    for name in ("docker", "apptainer"):
        (directory / name).write_text(CONTAINER)
    (directory / "srun").write_text(SRUN)
    for path in directory.iterdir():
        path.chmod(0o755)
    return Stubs(directory)


def calls(record: Path) -> list[list[str]]:
    """Every recorded call, in order: [program, arg, ...], each word as it arrived. (An empty file
    is a stub killed by a trap before it wrote anything, e.g. a backgrounded `ray start`.)"""
    files = sorted((p for p in record.iterdir() if p.is_file() and not p.name.startswith(".")), key=_order)
    out = []
    for path in files:
        words = path.read_bytes().split(b"\0")[:-1]
        if words:
            out.append([w.decode("utf-8", "surrogateescape") for w in words])
    return out


def _order(path: Path) -> tuple[int, str]:
    stamp = path.name.split(".", 1)[0]
    return (int(stamp) if stamp.isdigit() else 0, path.name)
