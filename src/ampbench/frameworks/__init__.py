"""Training code we did not write, measured as it is: a framework's own trainer plugs in where the pipeline's loop
would run. Imported only when ``train.framework`` names one.

- ``lightning``: a LightningModule under Lightning's Trainer and the precision plugin that means the arm; the
  speed stage's arm.
- ``readback``: the Callback the pipeline adds: the epochs' records, what ran, and the refusal of an arm that ran
  as something else.
"""
