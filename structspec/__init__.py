"""structspec: grammar-constrained, speculative structured-output decoding as a gRPC service."""

import os as _os

# OpenMP threads that wait for work spin before they sleep (GNU OpenMP: 300,000 spins by default).
# On a CPU shared with another busy process a spinning thread burns the time slice its peer needs,
# and each of a step's hundreds of parallel regions waits for it: a Gemma 3 270M decode step went
# from 36 ms to 169 ms beside a one-core neighbour (4.7x), and to 75 ms (2.0x, in proportion to
# the CPU left) with 1,000 spins, at the same speed on a quiet machine (`structspec bench step`).
# Read once, when torch loads its OpenMP runtime: set before any structspec module imports torch.
# The caller's own value wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000")
