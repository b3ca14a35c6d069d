"""One reader per benchmark client whose result files ``radixsched calibrate`` reads; each
turns a file into ``MeasuredRun``s (``sim.calibrate.measured`` detects which reader a file
needs)."""
