"""`cnclip tune`: the tuner, which measures this machine one configuration at a time (measure.py),
watches the load and the spread of its calls (noise.py), chooses per tower (tuner.py), fits the
choice into the memory budget (memory.py), checks it against the defaults through the encoder
`serve` runs (validate.py) and prints and writes it (report.py).

It writes the tuning file that the runtime reads (retrieval/tuning.py, part of the runtime core);
it may import the runtime core and the quality gate (retrieval/toolchain/gate.py), and nothing
outside the toolchain imports it but `cnclip tune` (cli/tune.py) and benchmarks."""
