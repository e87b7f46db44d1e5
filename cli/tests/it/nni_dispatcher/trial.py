"""An unmodified-style NNI trial: `steps` intermediate results (x, then x again...), waiting
for the assessor's verdict between them when asked to, then -(x - 0.3)^2 as its final (with
`dict` as the third argument, as the 'default' of a dict with more entries), as
`d * d` rather than `d ** 2`: `**` is libm's pow, which may round the last bit otherwise than
the tests' own `d * d`, and the tests compare the stored final exactly. It also writes the parameter id it was given
(`parameter_id.json` in its output folder), which NNI gives as its dispatcher sent it."""

import json
import os
import sys
import time

import nni

params = nni.get_next_parameter()
with open(os.path.join(os.environ['NNI_OUTPUT_DIR'], 'parameter_id.json'), 'w') as f:
    json.dump(nni.trial._params['parameter_id'], f)
x = params['x']
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for step in range(steps):
    nni.report_intermediate_result(x)
    time.sleep(pause)
distance = x - 0.3
if len(sys.argv) > 3 and sys.argv[3] == 'dict':
    # A dict final, as NNI's docs show: the tuner optimises 'default', a user's own tuner may
    # read the rest.
    nni.report_final_result({'default': -(distance * distance), 'accuracy': x, 'epochs': steps,
                             'tags': ['a', 'b']})
else:
    nni.report_final_result(-(distance * distance))
