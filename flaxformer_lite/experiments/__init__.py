"""Studies: the sweep runner, results rows with provenance, tables and plots from rows alone."""
