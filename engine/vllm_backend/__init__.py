"""Real vLLM as a stepscope backend: a recording scheduler subclass (`scheduler.py`, needs vLLM), the
`engine run --backend vllm` runner (`runner.py`) and the built-in model as an HF checkpoint.

Importing this package does not import vLLM; `scheduler.py` does.
"""

# The trace directory for the recording scheduler, read in the process where vLLM builds it.
TRACE_DIR_ENV = "STEPSCOPE_TRACE_DIR"
# Set to 1 to let the recorder replace a trace already in that directory (it refuses one otherwise).
TRACE_OVERWRITE_ENV = "STEPSCOPE_TRACE_OVERWRITE"
