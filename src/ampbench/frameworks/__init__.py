"""Training code we did not write, measured as it is: a framework's own trainer plugs in where the pipeline's loop
would run. Imported only when ``train.framework`` names one.

- ``lightning``: a LightningModule under Lightning's Trainer and the precision plugin that means the arm; the
  speed stage's arm.
- ``hf``: a Hugging Face ``transformers.Trainer`` of the user's parts with the arm's own flags; the speed stage's
  arm.
- ``readback``: ``StepBook``, what the frameworks' callbacks feed: the epochs' records, what ran, and the refusal
  of an arm that ran as something else.
"""
