import os

# Tests must not depend on the number of cores of the machine running them.
os.environ.setdefault("NUMBA_NUM_THREADS", "2")
