#!/usr/bin/env bash
# How a Python script that dies of an uncaught KeyboardInterrupt exits on this machine: plain,
# after joining a one-rank gloo group (torch.distributed installs its "[rankN]:" excepthook),
# with that hook put back, and after destroying the group. Python's own rule is to die of SIGINT
# (exit status -2 to a parent); the forty-third session's device run saw exit status 1 from the
# TP Ctrl-C test's script. Prints one line a case. Usage: bash benchmarks/sigint_exit_probe.sh
py=${PYTHON:-python3}
d=$(mktemp -d)
case_rc() {  # NAME CODE
  printf '%s\n' "$2" > "$d/$1.py"
  "$py" "$d/$1.py" > "$d/$1.out" 2> "$d/$1.err"; local rc=$?
  echo "$1: exit $rc ($(tail -1 "$d/$1.err" | cut -c1-100))"
}
init='import os, sys, torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("gloo", rank=0, world_size=1)'
case_rc plain 'raise KeyboardInterrupt'
case_rc gloo_group "$init
raise KeyboardInterrupt"
case_rc gloo_hook_restored "$init
sys.excepthook = sys.__excepthook__
raise KeyboardInterrupt"
case_rc gloo_destroyed "$init
dist.destroy_process_group()
raise KeyboardInterrupt"
case_rc gloo_destroyed_atexit "$init
import atexit; atexit.register(dist.destroy_process_group)
raise KeyboardInterrupt"
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
rm -rf "$d"
