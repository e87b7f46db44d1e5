"""Branin on knob's own protocol: parameters in $KNOB_PARAMETERS, metrics as stdout lines.

The global minimum is 0.397887, at (-pi, 12.275), (pi, 2.275) and (9.42478, 2.475).
"""
import json
import math
import os

params = json.loads(os.environ["KNOB_PARAMETERS"])
x1, x2 = params["x1"], params["x2"]

a, b, c = 1.0, 5.1 / (4 * math.pi ** 2), 5 / math.pi
r, s, t = 6.0, 10.0, 1 / (8 * math.pi)

# Report a few intermediate values, as a training loop would (one per "epoch").
value = a * (x2 - b * x1 ** 2 + c * x1 - r) ** 2 + s * (1 - t) * math.cos(x1) + s
for epoch in range(1, 4):
    print(f"KNOB_INTERMEDIATE {value * (1 + 1 / epoch)}", flush=True)
print(f"KNOB_FINAL {value}", flush=True)
