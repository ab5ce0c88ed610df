set -u; out=$OUT; export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py $tree; export PYTHONPATH=$tree:$PWD
P="-p enginespec.conformance.plugin --impl=fast"
timeout 70 python3 -m pytest $P -q -x --tb=short "conformance/test_parity.py::test_greedy_parity_on_cuda" tests/impls/test_fast_examples.py::test_one_builder_per_pool_released_with_it > $out/fails.log 2>&1; tail -60 $out/fails.log | grep -v "^  " | tail -40
sha=$(cat .sha)
timeout 200 python3 benchmarks/decode_sweep.py --git-commit $sha --out $out/sweep.json --profile > $out/sweep.log 2>&1; echo "sweep exit $?"; grep "^|\|Error" $out/sweep.log | head -40
timeout 170 python3 benchmarks/decode_sweep.py --git-commit $sha --out $out/sweep_skinny.json --profile --batches 1,2,4,8,16,32,64 --engine-arg skinny_gemm=true > $out/sweep_skinny.log 2>&1; echo "skinny exit $?"; grep "^|\|Error\|Warn\|warn" $out/sweep_skinny.log | head -40
timeout 60 python3 -m pytest $P -q --tb=line tests/kernels/test_skinny_gemm.py tests/worker/test_skinny_linear.py > $out/pytest_skinny.log 2>&1; tail -8 $out/pytest_skinny.log
