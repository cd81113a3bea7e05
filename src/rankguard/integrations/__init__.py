"""Framework integrations, each an optional extra and a thin adapter over the in-loop API
(``rankguard.init()``, ``step_end``, ``phase``, ``checkpoint``, ``set_batch``):

- ``rankguard.integrations.hf``: a Hugging Face ``TrainerCallback``
  (``pip install 'rankguard[hf]'``);
- ``rankguard.integrations.lightning``: a PyTorch Lightning ``Callback``
  (``pip install 'rankguard[lightning]'``), which ``rankguard run`` adds to every
  ``Trainer`` through Lightning's ``lightning.pytorch.callbacks_factory`` entry point.

Importing this package imports neither framework; each module imports its own and says
which extra to install when it is missing. Both share :mod:`.common`.
"""

__all__: list[str] = []
