"""The compatibility suite launches workers through the parallel tests' harness."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "parallel"))

# Horovod's own test files are run by the workers under horovodrun, never collected here.
collect_ignore = ["horovod_tests"]
