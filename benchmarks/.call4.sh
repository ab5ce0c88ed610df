set -u; out=$OUT; export PYTHONUNBUFFERED=1; sha=$(cat .sha)
tree=$(mktemp -d); python3 tools/link_tree.py $tree >/dev/null; export PYTHONPATH=$tree:$PWD
P="-p enginespec.conformance.plugin --impl=fast"
timeout 80 python3 benchmarks/bench_sampler.py --profile --json $out/sampler.json > $out/sampler.log 2>&1; echo "sampler exit $?"; grep -v "^{" $out/sampler.log | tail -25
timeout 150 python3 -m pytest $P -q -rfE --tb=line tests/sample tests/kernels/test_sampling.py conformance/test_async_scheduling.py "conformance/test_parity.py::test_greedy_parity_on_cuda" tests/impls/test_fast_examples.py tests/worker/test_skinny_linear.py tests/engine/test_warmup.py tests/worker/test_tensor_parallel.py tests/worker/test_tp_shard.py > $out/pytest.log 2>&1; echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|^E " $out/pytest.log | grep -v DEBUG | tail -15
c="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 120 python3 benchmarks/throughput.py $c --chat --out $out/chat.json > $out/chat.log 2>&1; echo "chat exit $?"; grep "^  engine\|^  floor\|^  startup\|^  first call" $out/chat.log
timeout 120 python3 benchmarks/throughput.py $c --temperature 0.6 --out $out/t06.json > $out/t06.log 2>&1; echo "t06 exit $?"; grep "^  engine\|^  floor\|^  startup\|^  first call" $out/t06.log
