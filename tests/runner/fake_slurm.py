"""A stand-in for SLURM's client tools, so that the SLURM launcher runs through submitit unchanged.

``install(folder)`` writes ``sbatch``, ``srun``, ``scontrol``, ``sacct``, ``squeue`` and ``scancel``
into ``folder/bin``. They keep their state in ``folder`` (``FAKE_SLURM_DIR``):

* ``sbatch SCRIPT`` keeps a copy of the script (``sbatch-<id>.sh``), and starts each array task
  at once as ``bash SCRIPT`` with the environment SLURM gives a job (job and array ids, rank 0);
* ``srun --output O --error E ... CMD`` runs CMD with its output in O and E (``%A %a %j %t``
  filled in);
* ``scontrol requeue JOB`` appends JOB to ``requeued`` and starts the job's script again once the
  calling process has exited, as SLURM does after a requeue;
* ``sacct`` prints the lines of ``sacct.txt`` (``JOBID|STATE|NODE``), if any: by default it
  knows no job, and submitit waits for the job's result file; ``squeue`` prints the lines of
  ``squeue.txt`` (``JOBID|STATE|REASON``), if any; ``scancel JOB...`` appends the jobs to
  ``cancelled`` and stops nothing;
* a file ``hold`` keeps submitted jobs pending (not started).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

_COMMON = """#!{python}
import json, os, re, subprocess, sys
from pathlib import Path

STATE = Path(os.environ["FAKE_SLURM_DIR"])


def start(script, env, after_pid=None):
    wait = f"while kill -0 {{after_pid}} 2>/dev/null; do sleep 0.1; done; " if after_pid else ""
    log = open(STATE / "bash.err", "a")
    subprocess.Popen(["sh", "-c", wait + f"exec bash {{script}}"], env=env, start_new_session=True,
                     stdout=log, stderr=log)
"""

_SBATCH = (
    _COMMON
    + """
script = Path(sys.argv[-1])
counter = STATE / "next_id"
job = int(counter.read_text()) if counter.exists() else 1000
counter.write_text(str(job + 1))
text = script.read_text()
(STATE / f"sbatch-{{job}}.sh").write_text(text)
array = re.search(r"^#SBATCH --array=0-(\\d+)", text, re.M)
for task in (range(int(array.group(1)) + 1) if array else [None]):
    job_id = f"{{job}}_{{task}}" if array else str(job)
    env = {{**os.environ, "SLURM_JOB_ID": str(job * 1000 + (task or 0)), "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_RESTART_COUNT": "0"}}
    if array:
        env.update(SLURM_ARRAY_JOB_ID=str(job), SLURM_ARRAY_TASK_ID=str(task))
    (STATE / f"job-{{job_id}}.json").write_text(json.dumps({{"script": str(script), "env": env}}))
    if not (STATE / "hold").exists():  # "hold": jobs stay pending
        start(script, env)
print(f"Submitted batch job {{job}}")
"""
)

_SRUN = """#!{python}
import os, sys

args, out, err = sys.argv[1:], None, None
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag == "--output":
        out = args.pop(0)
    elif flag == "--error":
        err = args.pop(0)
env = os.environ
job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
fill = lambda p: (p.replace("%A", job).replace("%a", env.get("SLURM_ARRAY_TASK_ID", ""))
                  .replace("%j", env["SLURM_JOB_ID"]).replace("%t", "0"))
for path, fd in ((out, 1), (err, 2)):
    if path:
        os.dup2(os.open(fill(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
os.execvp(args[0], args)
"""

_SCONTROL = (
    _COMMON
    + """
assert sys.argv[1] == "requeue", sys.argv
job_id = sys.argv[2]
with open(STATE / "requeued", "a") as handle:
    handle.write(job_id + "\\n")
record = json.loads((STATE / f"job-{{job_id}}.json").read_text())
env = {{**record["env"], "SLURM_RESTART_COUNT": str(int(record["env"]["SLURM_RESTART_COUNT"]) + 1)}}
start(record["script"], env, after_pid=os.getppid())
"""
)

_SACCT = """#!/bin/sh
echo "JobID|State|NodeList"
cat "$FAKE_SLURM_DIR/sacct.txt" 2>/dev/null
exit 0
"""

_SQUEUE = """#!/bin/sh
cat "$FAKE_SLURM_DIR/squeue.txt" 2>/dev/null
exit 0
"""

_SCANCEL = """#!/bin/sh
for job in "$@"; do echo "$job" >>"$FAKE_SLURM_DIR/cancelled"; done
exit 0
"""


def install(folder: Path) -> Path:
    """Write the fake tools into ``folder/bin`` and return that folder (put it first on PATH and
    set ``FAKE_SLURM_DIR`` to ``folder``)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("sbatch", _SBATCH),
        ("srun", _SRUN),
        ("scontrol", _SCONTROL),
        ("sacct", _SACCT),
        ("squeue", _SQUEUE),
        ("scancel", _SCANCEL),
    ):
        path = bin_dir / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def environment(folder: Path) -> dict[str, str]:
    """The variables that put the fake tools in front of any real ones."""
    return {
        "PATH": f"{install(folder)}{os.pathsep}{os.environ.get('PATH', '')}",
        "FAKE_SLURM_DIR": str(folder),
    }
