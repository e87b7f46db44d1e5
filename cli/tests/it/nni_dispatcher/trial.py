"""An unmodified-style NNI trial: `steps` intermediate results (x, then x again...), waiting
for the assessor's verdict between them when asked to, then -(x - 0.3)^2 as its final."""

import sys
import time

import nni

params = nni.get_next_parameter()
x = params['x']
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for step in range(steps):
    nni.report_intermediate_result(x)
    time.sleep(pause)
nni.report_final_result(-(x - 0.3) ** 2)
