#!/usr/bin/env bash
# How a Python script that dies of an uncaught KeyboardInterrupt exits on this machine: plain,
# after joining a one-rank gloo group (torch.distributed installs its "[rankN]:" excepthook),
# with that hook put back, after destroying the group, and after building an LLM (with TP=2 too). Python's own rule is to die of SIGINT
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
# An engine built, then the same raise (on the device's Python 3.12.3 this one exited 1, TP or
# not: forty-third session). Needs enginespec importable (tools/link_tree.py's tree).
"$py" -c "from enginespec.testing.checkpoints import make_checkpoint; make_checkpoint('qwen3', '$d/qwen3')" 2>/dev/null
case_rc llm_built "from enginespec import LLM
if __name__ == '__main__':
    llm = LLM('$d/qwen3', impl='fast', device='cpu', dtype='float32')
    raise KeyboardInterrupt"
case_rc llm_tp2_built "from enginespec import LLM
if __name__ == '__main__':
    llm = LLM('$d/qwen3', impl='fast', device='cpu', dtype='float32', tensor_parallel_size=2)
    raise KeyboardInterrupt"
# The cause (forty-fourth session): CPython clears its "uncaught KeyboardInterrupt" flag whenever
# an exec/eval of a string runs (PyRun_StringFlags), a namedtuple's too, and shutdown ran one:
# torch dynamo's atexit dump_compile_times imports tabulate where it is installed.
case_rc namedtuple_at_exit 'import atexit, collections
atexit.register(lambda: collections.namedtuple("T", "a b"))
raise KeyboardInterrupt'
"$py" -c 'import tabulate' 2>/dev/null && echo "tabulate installed" || echo "tabulate not installed"
"$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
rm -rf "$d"
