"""The process the pipeline runs in: devices, seeds, files and the console — what every other package stands on.

- ``distributed``: torchrun/DDP: the process group, each rank's slice of a batch, all-reduce.
- ``determinism``: seeding and the deterministic-algorithm switches.
- ``hardware``: the device fingerprint, peak memory, a GPU's dense peak TFLOP/s by dtype.
- ``memory``: whether a device's peak memory can be told apart by arm (CUDA only): the speed harness, the bench and
  the report follow that one rule (torch-free).
- ``provenance``: the code hash and git/DVC revision tags every run records.
- ``processes``: process identity (for closing dead processes' runs), ``dvc`` watching, process groups.
- ``server``: a server process of ours (the MLflow UI): its port, its log, the wait for its answer, its stop.
- ``signals``: how a process of ours ends when told to stop: one line, what is kept, the exit status.
- ``files``: atomic writes, reports published together, JSON reads that name the bad file.
- ``console``: progress lines for people, on stderr.
- ``preload``, ``preload_server``, ``preload_child``: a stage's start-up paid once — a server that imported torch and
  MLflow forks each stage command (``pipeline/python`` runs the client); scripts, standard library only.
"""
