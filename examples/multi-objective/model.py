"""A stand-in for training a model: bigger and deeper models are more accurate but slower and
use more memory. Reports every objective in one dict, with knob's own protocol (an `import
nni` script would call nni.report_final_result with the same dict)."""
import json
import math
import os

params = json.loads(os.environ["KNOB_PARAMETERS"])
width, depth, dropout = params["width"], params["depth"], params["dropout"]
capacity = math.log2(width) * depth
accuracy = 0.98 - 0.5 * math.exp(-capacity / 12) - 0.2 * (dropout - 0.2) ** 2
latency_ms = 1.5 + width * depth / 60
memory_mib = 20 + width * depth * 0.12
print("KNOB_FINAL", json.dumps({
    "accuracy": accuracy,
    "latency_ms": latency_ms,
    "memory_over_budget": memory_mib - 300,
}))
