"""First on the path of every graded kernel (tools/grade.py) and of every process `make test`
starts (the Makefile's PYTHONPATH): jsonschema (under nbformat, nbclient, otter and jupyter-events)
imports rfc3987_syntax, when installed, only to check the "iri" string format, which no notebook
schema uses; building its grammar costs ~1-1.5 s of CPU per process that imports nbformat.
Raising ImportError here makes jsonschema skip that one format, as if the package were absent."""
raise ImportError("rfc3987_syntax is not loaded here (see tools/kernel_site/rfc3987_syntax.py)")
