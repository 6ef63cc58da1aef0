import os
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("IN_TEST", "1")

# A subprocess a test starts gets this long before it counts as hung. It guards against a hang, never against slowness:
# on a 2-core machine shared with other jobs, a GPU-check dry run that takes 46 s alone took 257 s, and a 300 s limit
# failed a test that would have passed. Speed goals live in bench/, not in tests.
HANG_TIMEOUT = 3600
