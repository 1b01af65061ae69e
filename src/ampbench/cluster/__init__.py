"""The grid beyond one machine: a Ray cluster trains the stale arm × seed cells, DVC records them.

- ``repro``: ``ampbench cluster repro``: the checks, the cells on the cluster, then ``dvc repro`` here.
- ``grid``: cells, what a cell asks of a node (``Placement``) and the checks before any cell starts.
- ``workspace``: the head's DVC side: inputs pushed to the remote, stale train stages, finished seeds, landing.
- ``ray_backend``: the one module that imports Ray: connect, nodes, probes, the cells as tasks, cancelling.
- ``cell``: what runs on a worker node for one cell (standard library only; pickled by value).
"""
