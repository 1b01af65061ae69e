"""What the user asks for and where it lives: the params schema and its checks, the arm registry, the output layout,
the schemas of the files stages hand each other, and importing the user's own code.

- ``arms``: the arm registry: names, the baseline, opt-in arms, ablations, the pairs that conflict.
- ``params``: the params.yaml schema (type, default, doc, the stages that read each key).
- ``knobs``: what the schema's sections are made of: ``knob``, bounds, the sections' base.
- ``validation``: a params.yaml checked against it: one line naming the bad key, before any work.
- ``rules``: the one table of rules between keys (each valid alone, not together), run by the check stage.
- ``sync``: params.yaml's comments and dvc.yaml's params lists written from the schema (``make params``).
- ``layout``: where every stage reads and writes (the paths dvc.yaml declares).
- ``records``: the schemas of meta.json, summary.json, history.json and interleaved.json, read into typed objects.
- ``user_code``: importing ``package.module:callable``; is its file a DVC dependency?
"""
