#!/usr/bin/env bash
# One lent-GPU session's checks in one go (device tool: `bash benchmarks/gpu_session.sh`),
# each step under its own time limit so a slow one cannot eat the others' time.
# Writes logs and tables under $OUT (or ./gpu_out). Missing pure-Python wheels
# (gymnasium is not in the GPU image) travel in .whl/, made beforehand where pip works:
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: -d .whl gymnasium==1.4.0 farama-notifications==0.0.6
# and carried with the call. Used on 2026-11-27 (an H200, 2 calls, ~13 of 15 minutes):
#   TESTS=150 DQN=50 BENCH=160 COMPILED=90 bash benchmarks/gpu_session.sh      (392 s)
#   STEPS="tests compiled" TESTS=150 COMPILED=215 bash benchmarks/gpu_session.sh (346 s)
# and in session 13 (an H200 again, 2 calls, ~11 of 15 minutes; the cuda-marked tests
# alone take ~125 s with 4 workers, the compiled table ~155 s, the eager one ~190 s):
#   STEPS="tests compiled" TEST_FILES="" TESTS=130 bash benchmarks/gpu_session.sh     (313 s)
#   STEPS="tests compiled dqn bench" CUDA_TESTS="tests/test_cuda.py -k bandit" DOMAINS=bandit ... (279 s)
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 POPPLAY_TEST_NO_WARM=1
if ! command -v popplay >/dev/null; then  # the checkout is not pip-installed there: the console script by hand
    mkdir -p /tmp/popplay-bin && printf '#!/bin/sh\nexec python3 -m popplay "$@"\n' >/tmp/popplay-bin/popplay
    chmod +x /tmp/popplay-bin/popplay && export PATH=/tmp/popplay-bin:$PATH
fi
TESTS=${TESTS:-150} BENCH=${BENCH:-170} DQN=${DQN:-60} COMPILED=${COMPILED:-220}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, numba, numpy, gymnasium; print('torch', torch.__version__, 'numba', numba.__version__, \
'numpy', numpy.__version__, 'gymnasium', gymnasium.__version__, 'cuda', torch.cuda.is_available())"
    nproc
} 2>&1 | tee "$OUT/steps.txt"  # the machine heads the step log (at most 8 files come back)

STEPS=${STEPS:-tests dqn bench compiled}  # a rerun names only the steps it needs
step() {  # step NAME SECONDS COMMAND...: one step, its log in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
    tail -n 6 "$OUT/$name.log"
}

# the cuda-marked tests, then the files whose tests change course where a GPU is present
# (TEST_FILES="" runs only the cuda-marked ones; CUDA_TESTS narrows those, e.g. "tests/test_cuda.py -k bandit")
TEST_FILES=${TEST_FILES-tests/test_deep_cli.py tests/test_benchmarks.py tests/test_cli_bandit.py}
CUDA_TESTS=${CUDA_TESTS:-tests/}
step tests "$TESTS" bash -c "python3 -m pytest -q -p no:cacheprovider -n 4 -m cuda $CUDA_TESTS; \
[ -z '$TEST_FILES' ] || python3 -m pytest -q -p no:cacheprovider -n 4 $TEST_FILES"
step dqn "$DQN" python3 -c "import sys, json; sys.path.insert(0, 'benchmarks'); import gpu; \
print(json.dumps(gpu.dqn_population('cuda', gpu.DQN_MEMBERS, gpu.DQN_STEPS_PER_MEMBER)))"
step bench "$BENCH" python3 benchmarks/gpu.py --skip-dqn --json "$OUT/gpu.json" --markdown "$OUT/gpu.md"
step compiled "$COMPILED" python3 benchmarks/gpu.py --compile --skip-dqn --skip-numba \
    --domains "${DOMAINS:-bandit,cartpole,knights}" --json "$OUT/gpu_compiled.json" --markdown "$OUT/gpu_compiled.md"
cat "$OUT/steps.txt"
